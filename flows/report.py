"""Stage 5: gather every algorithm's run -> metrics.json, a comparison table, accuracy-vs-bytes plot."""

from __future__ import annotations

import json
import sys

import flows  # noqa: F401
from prefect import flow, task

from pipeline import paths
from pipeline.config import load_params
from pipeline.report import comparison_rows, format_table, plot_accuracy_vs_bytes, write_outputs
from pipeline.results import ResultsDB


@task
def gather(algorithms: list[str]) -> list[dict]:
    summaries = []
    for alg in algorithms:
        path = paths.run_dir(alg) / "summary.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run dvc repro train@{alg}")
        summaries.append(json.loads(path.read_text()))
    return summaries


@flow(name="report")
def report_flow(params_file: str = "params.yaml") -> list[dict]:
    params = load_params(params_file)
    summaries = gather(params.train.algorithms)
    db = ResultsDB(paths.RESULTS_DB)
    rows = comparison_rows(summaries)
    write_outputs(rows, paths.METRICS, paths.REPORT_DIR)
    plot_accuracy_vs_bytes(db, summaries, paths.REPORT_DIR / "accuracy_vs_bytes.png")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(report_flow))
