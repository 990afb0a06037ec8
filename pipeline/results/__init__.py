"""Results: the per-run store and its index, comparisons, the report and the paper's figures."""
