"""The index's privacy table as the dashboard reads it (the audit's figures, pipeline.results.privacy.METRICS: the
mean over the audited clients with its 95% interval; issue 40). Its own module: dashboard/data/load.py reads it on
the snapshot's connection, dashboard/data/privacy.py makes the Privacy tab's frames of it."""

from __future__ import annotations

import duckdb
import pandas as pd

INDEX_CATALOG = "src_index"  # the index's catalog in a reading connection (absent when it is passed over or missing)
PRIVACY_COLUMNS = ["run_id", "metric", "mean", "low", "high"]


def read_privacy(con: duckdb.DuckDBPyConnection, ids: list[str], catalog: str = INDEX_CATALOG) -> pd.DataFrame | None:
    """The runs' rows of the index's privacy table; None when the index has no such table (built before the audit)
    or none was read. The table is the index's alone: a per-run file holds no audit."""
    found = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main' "
                        "AND table_name = 'privacy'", [catalog]).fetchone()[0]
    if not found:
        return None
    if not ids:
        return pd.DataFrame(columns=PRIVACY_COLUMNS)
    return con.execute(f"SELECT run_id, metric, mean, low, high FROM {catalog}.privacy WHERE run_id IN "
                       f"({', '.join('?' * len(ids))}) ORDER BY run_id, metric", ids).df()
