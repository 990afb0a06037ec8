"""Stage 5: gather every algorithm's run -> metrics.json, a comparison table, accuracy-vs-bytes plot,
and the results index results/results.duckdb, rebuilt from every stage's results/runs/<name>/run.duckdb."""

from __future__ import annotations

import json
import sys

import flows  # noqa: F401
from prefect import flow, task

from pipeline import paths
from pipeline.experiments import dvc as experiments
from pipeline.results.compare import budget_rows, comparison, differences
from pipeline.config import Params, load_params
from pipeline.results.report import (format_budget, format_differences, format_paper_table, format_table, plot_accuracy_vs_bytes,
                                     plot_accuracy_vs_sim_time, verdict_line, write_outputs)
from pipeline.results.privacy import format_privacy, noise_of, privacy_row, read_audits
from pipeline.results.store import ResultsDB, rebuild_index


def stage_runs(params: Params) -> list[tuple[dict, str]]:
    """(summary, results file) of every training stage of this pipeline (homogeneous, then heterogeneous)."""
    out = []
    runs = [(a, False) for a in params.train.algorithms] + [(a, True) for a in params.train.hetero_algorithms]
    for alg, hetero in runs:
        path = paths.run_dir(alg, hetero) / "summary.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: run dvc repro {paths.stage(alg, hetero)}")
        out.append((json.loads(path.read_text()), str(paths.run_results(alg, hetero))))
    return out


def make_report(params: Params, gathered: list[tuple[dict, str]]) -> list[dict]:
    """The comparison of the gathered runs -> the index (rebuilt, with the table), metrics.json, the report files."""
    target = params.report.target_acc.get(params.data.dataset)
    # each run from its own stage's file (read once, used by the table and the plot)
    runs = [ResultsDB(path).series([summary["run_id"]])[0] for summary, path in gathered]
    rows = comparison(runs, target, baseline=params.report.baseline)
    diffs = differences(runs)  # every method against local-only and FedCache, paired by client
    rebuilt = rebuild_index(paths.RESULTS_DB, paths.RUNS, comparison=(",".join(s.run_id for s in runs), rows),
                            differences=diffs)
    print(rebuilt.message)
    # the privacy audit of each run that has one (audit@<method>, audit-hetero@<method>)
    audits = read_audits([paths.run_name(a) for a in params.train.algorithms]
                         + [paths.run_name(a, hetero=True) for a in params.train.hetero_algorithms])
    summaries = {paths.run_name(s["algorithm"], s.get("setting") == "hetero"): s for s, _ in gathered}
    privacy = [privacy_row(name, audit, summaries.get(name)) for name, audit in audits.items()]
    noise = {name: noise_of(s) for name, s in summaries.items() if noise_of(s) is not None}
    write_outputs(rows, paths.METRICS, paths.REPORT_DIR, params.data.dataset, diffs, budget_rows(runs, target),
                  privacy, noise)
    plot_accuracy_vs_bytes(runs, paths.REPORT_DIR / "accuracy_vs_bytes.png")
    timed_plot = paths.REPORT_DIR / "accuracy_vs_sim_time.png"
    timed_plot.unlink(missing_ok=True)  # an earlier report's, when these runs have no simulated time
    plot_accuracy_vs_sim_time(runs, timed_plot)  # only when a run has simulated time (devices.enabled)
    print(format_table(rows))
    if diffs:
        print(f"\n{verdict_line(diffs)}\n\n{format_differences(diffs)}")
    budget = budget_rows(runs, target)  # timed runs (devices.enabled): one grid of simulated instants
    if budget:
        print(f"\n{format_budget(budget)}")
    if privacy:
        print(f"\nWhat a curious server and a model holder learn (results/audit/, docs/privacy.md):\n"
              f"{format_privacy(privacy)}")
    beside = format_paper_table(rows, params.data.dataset)
    if beside:
        print(f"\nThe FedCache paper (K = 300, all training samples), same dataset, method and setting:\n{beside}")
    exp = experiments.current()
    if exp is not None:  # a queued experiment (sweep): its runs to the main checkout's index as well
        for folder in experiments.publish(exp):
            print(f"published {folder}")
    return rows


@task
def gather(params: Params) -> list[tuple[dict, str]]:
    return stage_runs(params)


@flow(name="report")
def report_flow(params_file: str = "params.yaml") -> list[dict]:
    params = load_params(params_file, methods=())  # the shared sections: it runs no method
    return make_report(params, gather(params))


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(report_flow))
