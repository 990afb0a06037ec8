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
import time

from workspace import deep_merge, fresh_trainer, load_workspace, prepare_workspace

PRESETS = {
    "default": {},
    "paper": {"partition": {"num_clients": 300, "samples_per_client": None, "alpha": 1.0},
              "train": {"model": "resnet20"}},
}


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
    overrides = deep_merge(PRESETS[args.preset], {"train": {"rounds": rounds, "algorithms": [args.algorithm]}})
    work = prepare_workspace(args.preset, overrides, ("partition", "encode", "index"))
    params, part, ds = load_workspace(work)
    start = time.perf_counter()
    trainer = fresh_trainer(params, args.algorithm, part, ds)
    trainer.start()
    print(f"\n{args.preset}: K={part.num_clients}, {part.num_train} training samples, model {params.train.model}"
          f"{' (hetero)' if trainer.hetero else ''}, batch {params.train.batch_size}, torch threads "
          f"{params.train.threads}; set-up (clients, models, round 0) {time.perf_counter() - start:.1f} s")
    print("| round | wall s | compute s | exchange s | db s | checkpoint s | other % |")
    print("|---|---|---|---|---|---|---|")
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        trainer.run_round(rnd)
        wall = time.perf_counter() - t0
        sec = dict(trainer.timer.seconds)
        other = sum(sec.get(k, 0.0) for k in ("exchange", "db", "checkpoint", "select"))
        print(f"| {rnd} | {wall:.2f} | {wall - other:.2f} | {sec.get('exchange', 0):.3f} | {sec.get('db', 0):.3f} | "
              f"{sec.get('checkpoint', 0):.3f} | {100 * other / wall:.1f} |", flush=True)
    trainer.finish()
    overhead = prefect_task_overhead()
    print(f"Prefect: {overhead * 1000:.1f} ms per task run (one per round) = "
          f"{100 * overhead / wall:.2f}% of the last round")


if __name__ == "__main__":
    main()
