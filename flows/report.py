"""Stage 5: gather every algorithm's run -> metrics.json, a comparison table, accuracy-vs-bytes plot."""

from __future__ import annotations

import json
import sys

import flows  # noqa: F401
from prefect import flow, task

from pipeline import paths
from pipeline.compare import comparison
from pipeline.config import Params, load_params
from pipeline.report import format_table, plot_accuracy_vs_bytes, write_outputs
from pipeline.results import ResultsDB


@task
def gather(params: Params) -> list[dict]:
    """The summary of every training stage of this pipeline (homogeneous, then heterogeneous)."""
    summaries = []
    runs = [(a, False) for a in params.train.algorithms] + [(a, True) for a in params.train.hetero_algorithms]
    for alg, hetero in runs:
        path = paths.run_dir(alg, hetero) / "summary.json"
        if not path.exists():
            stage = f"train-hetero@{alg}" if hetero else f"train@{alg}"
            raise FileNotFoundError(f"{path} not found: run dvc repro {stage}")
        summaries.append(json.loads(path.read_text()))
    return summaries


@flow(name="report")
def report_flow(params_file: str = "params.yaml") -> list[dict]:
    params = load_params(params_file)
    summaries = gather(params)
    db = ResultsDB(paths.RESULTS_DB)
    target = params.report.target_acc.get(params.data.dataset)
    runs = db.series([s["run_id"] for s in summaries])  # read once, used by the table and the plot
    rows = comparison(runs, target)
    db.write_comparison(",".join(s["run_id"] for s in summaries), rows)
    write_outputs(rows, paths.METRICS, paths.REPORT_DIR)
    plot_accuracy_vs_bytes(runs, paths.REPORT_DIR / "accuracy_vs_bytes.png")
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(report_flow))
