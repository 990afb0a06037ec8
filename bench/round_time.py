"""Per-round wall time split into model compute and everything else.

    .venv/bin/python bench/round_time.py --preset default   # params.yaml as is (2 rounds)
    .venv/bin/python bench/round_time.py --preset paper     # K=300, full FashionMNIST, ResNet-20 (1 round)

It prepares the inputs in bench/.work/<preset>/ by running the partition, encode and index
stages (their CLIs, so Prefect included; each stage's wall time is printed), then runs the
training rounds in-process and reports, per round: total wall time, time in the FedCache
exchange (cache gather/update + ledger), result/knowledge DB writes, checkpointing, client
selection, and the remainder (forward/backward/optimizer steps, batching, evaluation), which
is the model compute. Prefect's cost per round (one task run) is measured separately.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PRESETS = {
    "default": {},
    "paper": {"partition": {"num_clients": 300, "samples_per_client": None, "alpha": 1.0},
              "train": {"model": "resnet20"}},
}


def prepare(preset: str, rounds: int, algorithm: str) -> Path:
    work = ROOT / "bench" / ".work" / preset
    work.mkdir(parents=True, exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in PRESETS[preset].items():
        params[section].update(values)
    params["train"].update(rounds=rounds, algorithms=[algorithm])
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for stage in ("partition", "encode", "index"):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", f"flows.{stage}"], cwd=work, env=env, check=True)
        print(f"stage {stage:9s}: {time.perf_counter() - start:6.1f} s wall (incl. Prefect start-up)", flush=True)
    return work


def prefect_task_overhead(n: int = 20) -> float:
    import flows  # noqa: F401
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    @task(cache_policy=NO_CACHE)
    def noop(i: int) -> int:
        return i

    @flow
    def many() -> float:
        noop(0)
        start = time.perf_counter()
        for i in range(n):
            noop(i)
        return (time.perf_counter() - start) / n

    return many()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=PRESETS, default="default")
    ap.add_argument("--rounds", type=int, default=None, help="rounds to time (default: 2, paper: 1)")
    ap.add_argument("--algorithm", default="fedcache")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.preset == "paper" else 2)
    work = prepare(args.preset, rounds, args.algorithm)
    os.chdir(work)

    from pipeline import paths
    from pipeline.algorithms import REGISTRY
    from pipeline.config import load_params
    from pipeline.data import load_dataset
    from pipeline.engine import Trainer
    from pipeline.partition import Partition
    from pipeline.results import ResultsDB

    params = load_params("params.yaml")
    part = Partition.load(paths.PARTITION)
    ds = load_dataset(params.data.dataset, params.data.root)
    paths.checkpoint_path(args.algorithm).unlink(missing_ok=True)
    start = time.perf_counter()
    trainer = Trainer(params, REGISTRY[args.algorithm], part, ds, paths.run_dir(args.algorithm),
                      paths.checkpoint_path(args.algorithm), ResultsDB(paths.RESULTS_DB), [paths.PARTITION])
    trainer.start()
    print(f"\n{args.preset}: K={part.num_clients}, {part.num_train} training samples, model {params.train.model}"
          f"{' (hetero)' if params.train.hetero else ''}, batch {params.train.batch_size}, torch threads "
          f"{params.train.threads}; set-up (clients, models, round 0) {time.perf_counter() - start:.1f} s")
    print("| round | wall s | compute s | exchange s | db s | checkpoint s | other % |")
    print("|---|---|---|---|---|---|---|")
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        trainer.run_round(rnd)
        wall = time.perf_counter() - t0
        sec = dict(trainer.ctx.timer.seconds)
        other = sum(sec.get(k, 0.0) for k in ("exchange", "db", "checkpoint", "select"))
        print(f"| {rnd} | {wall:.2f} | {wall - other:.2f} | {sec.get('exchange', 0):.3f} | {sec.get('db', 0):.3f} | "
              f"{sec.get('checkpoint', 0):.3f} | {100 * other / wall:.1f} |", flush=True)
    trainer.finish()
    overhead = prefect_task_overhead()
    print(f"Prefect: {overhead * 1000:.1f} ms per task run (one per round) = "
          f"{100 * overhead / wall:.2f}% of the last round")


if __name__ == "__main__":
    main()
