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
from pathlib import Path

import psutil

import flows  # noqa: F401
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.logs import log_progress
from pipeline import paths, progress
from pipeline.methods.registry import REGISTRY
from pipeline.config import ConfigError, Params, load_params
from pipeline.data.datasets import load_dataset
from pipeline.train.engine import Trainer
from pipeline.data.partition import Partition
from pipeline.results.store import RunResultsDB


@task(cache_policy=NO_CACHE)
def prepare(params: Params, algorithm: str, hetero: bool) -> Trainer:
    part = Partition.load(paths.PARTITION)
    ds = load_dataset(params.data.dataset, params.data.root, params.data.download)
    return Trainer(params, REGISTRY[algorithm], part, ds, paths.run_dir(algorithm, hetero),
                   paths.checkpoint_path(algorithm, hetero), RunResultsDB(paths.run_results(algorithm, hetero)),
                   hetero=hetero)


def summary_path(trainer: Trainer) -> Path:
    return paths.run_dir(trainer.algorithm.name, trainer.hetero) / "summary.json"


@task(cache_policy=NO_CACHE)
def start(trainer: Trainer) -> int:
    summary_path(trainer).unlink(missing_ok=True)  # an earlier run's: written again when this one completes
    return trainer.start()


@task(cache_policy=NO_CACHE, task_run_name="round-{round_}")
def train_round(trainer: Trainer, round_: int) -> None:
    trainer.run_round(round_)


@task(cache_policy=NO_CACHE)
def finish(trainer: Trainer) -> dict:
    summary = trainer.finish()
    summary_path(trainer).write_text(json.dumps(summary, indent=1))
    return summary


@flow(name="train", flow_run_name="train-{algorithm}")
def train_flow(algorithm: str, params_file: str = "params.yaml", hetero: bool = False) -> dict:
    flow_start = time.time()
    params = load_params(params_file)
    if algorithm not in REGISTRY:
        raise ConfigError(f"unknown algorithm {algorithm!r}; choose one of {', '.join(REGISTRY)}")
    trainer = prepare(params, algorithm, hetero)
    prepared = time.time()
    name = paths.run_name(algorithm, hetero)
    try:
        first = start(trainer)
        if first > 1:
            print(f"{algorithm}: resuming run {trainer.run_id} at round {first}")
        # a bar over the rounds (a line per round where stderr is no terminal, and in the Prefect run's logs),
        # and one over each round's clients in a terminal
        trainer.executor.bars = progress.nested(f"{name} round clients")
        with progress.bar(params.train.rounds, name, "round", initial=first - 1, every_s=0) as rounds:
            for round_ in range(first, params.train.rounds + 1):
                train_round(trainer, round_)
                acc = trainer.history[-1][1]
                rounds.set_postfix_str(("" if acc is None else f"acc {acc:.4f}, ") +
                                       f"{trainer.ctx.ledger.total() / 1e6:,.2f} MB so far", refresh=False)
                rounds.update(1)
                log_progress(progress.state(rounds))
        summary = finish(trainer)
        # where the stage's time went besides its rounds: the process's start (interpreter, imports, the
        # Prefect server) before the flow, and loading the data and building the clients
        summary["seconds"].update(startup=round(flow_start - psutil.Process().create_time(), 3),
                                  prepare=round(prepared - flow_start, 3))
        summary_path(trainer).write_text(json.dumps(summary, indent=1))
    finally:
        trainer.close()  # the dask executor's cluster stops here, also when a round fails
    print(f"{name}: MAUA {summary['maua']:.4f}, final {summary['final_acc']:.4f}, "
          f"bytes {summary['bytes_total']:,} ({summary['bytes_setup']:,} set-up)")
    return summary


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(train_flow, positional=("algorithm",), flags=("hetero",)))
