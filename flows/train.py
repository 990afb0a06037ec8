"""Stage 4 (one per algorithm): federated rounds; per-round metrics and bytes -> the stage's own
results file, results/runs/<name>/run.duckdb (pipeline.results.store).

    .venv/bin/python -m flows.train <algorithm> [--hetero] [--params params.yaml]

A killed run started again continues from its last checkpointed round; a new run clears what an
earlier run left in results/runs/<name>/ (the stage's output persists across `dvc repro`, see dvc.yaml).
"""

from __future__ import annotations

import json
import sys
import time

import psutil

import flows  # noqa: F401
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
# torch.optim imports torch._dynamo at a model's first step (1.32 s); imported here, while the collector is
# paused (flows/__init__.py), it costs 1.07 s
import torch._dynamo  # noqa: F401,E402

from flows.logs import log_progress
from pipeline import paths, progress
from pipeline.config import Params, load_params
from pipeline.data.datasets import load_dataset
from pipeline.data.partition import Partition
from pipeline.experiments import dvc as experiments
from pipeline.methods.registry import method_class
from pipeline.results.store import RunResultsDB
from pipeline.train.engine import RunInfo, Trainer


def run_info(params: Params) -> RunInfo:
    """Where this run ran: the git revision, and the DVC experiment (set by `dvc exp run`) with the
    params it changed, recorded with the run for sweeps."""
    exp = experiments.current()
    return RunInfo(experiments.git_revision(), exp.name if exp else None, experiments.changed_params(params, exp))


@task(cache_policy=NO_CACHE)
def prepare(params: Params, algorithm: str, hetero: bool) -> Trainer:
    part = Partition.load(paths.PARTITION)
    ds = load_dataset(params.data.dataset, params.data.root, params.data.download)
    return Trainer(params, method_class(algorithm), part, ds, paths.run_dir(algorithm, hetero),
                   paths.checkpoint_path(algorithm, hetero), RunResultsDB(paths.run_results(algorithm, hetero)),
                   hetero=hetero, run_info=run_info(params))


@flow(name="train", flow_run_name="train-{algorithm}")
def train_flow(algorithm: str, params_file: str = "params.yaml", hetero: bool = False) -> dict:
    flow_start = time.time()
    params = load_params(params_file, methods=(algorithm,))  # the shared sections and this method's; an
    # unknown method is a ConfigError naming the methods there are
    trainer = prepare(params, algorithm, hetero)
    prepared = time.time()
    name = paths.run_name(algorithm, hetero)
    summary_path = paths.run_dir(algorithm, hetero) / "summary.json"
    summary_path.unlink(missing_ok=True)  # an earlier run's: written again when this one completes
    # a bar over the rounds (a line per round where stderr is no terminal, and in the Prefect run's logs),
    # and one over each round's clients in a terminal
    trainer.executor.bars = progress.nested(f"{name} round clients")
    with progress.bar(params.train.rounds, name, "round", every_s=0) as rounds:
        def on_start(first: int) -> None:
            if first > 1:
                print(f"{algorithm}: resuming run {trainer.run_id} at round {first}")
                rounds.n = rounds.initial = first - 1  # done before: not counted in the time estimate

        def on_round(round_: int) -> None:
            acc = trainer.history[-1][1]
            rounds.set_postfix_str(("" if acc is None else f"acc {acc:.4f}, ") +
                                   f"{trainer.ledger.total() / 1e6:,.2f} MB so far", refresh=False)
            rounds.update(1)
            log_progress(progress.state(rounds))

        summary = trainer.run(on_start, on_round)
    # where the stage's time went besides its rounds: the process's start (interpreter, imports, the
    # Prefect server) before the flow, and loading the data and building the clients
    summary["seconds"].update(startup=round(flow_start - psutil.Process().create_time(), 3),
                              prepare=round(prepared - flow_start, 3))
    summary_path.write_text(json.dumps(summary, indent=1))
    print(f"{name}: MAUA {summary['maua']:.4f}, final {summary['final_acc']:.4f}, "
          f"bytes {summary['bytes_total']:,} ({summary['bytes_setup']:,} set-up)")
    return summary


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(train_flow, positional=("algorithm",), flags=("hetero",),
                       methods=lambda args: (args["algorithm"],)))
