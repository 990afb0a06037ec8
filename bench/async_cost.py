"""The cost of the async schedule: wall seconds per simulated round (a span) of async against a sync round.

    .venv/bin/python bench/async_cost.py                    # params.yaml's scale, 3 rounds, 2 repeats
    .venv/bin/python bench/async_cost.py --rounds 2 --repeats 1

On params.yaml's setting with the devices on (their default population) and FedCache's round
consistency, it trains FedCache and FedAvg once under `train.schedule: sync` (params.yaml's executor)
and once under `async` (a span: the median client's update time, async's default), each pair
alternated in one process (sync, async, sync, async, ...) so that a busy machine slows both alike,
torch on 1 thread. Prints, per method and schedule, the median wall seconds of a round (training,
exchange and evaluation; the set-up round left out), the client updates the server received per round,
the wall seconds per update, and the ratio async / sync of both (goal: a span under 1.5x a round).

An async span does not do a sync round's work: each client updates as often as its device allows, so a
span of the median client's update time holds more updates than the K of a sync round (the fast
clients' several, the slow ones' part of one), and async trains them one at a time (the sequential
executor), where sync may batch clients (vectorized). The per-update ratio is what the event loop
itself costs.

Inputs in bench/.work/async_cost/ (the partition, encode and index stages, through their CLIs).
"""

from __future__ import annotations

import argparse
import statistics
import time

from workspace import fresh_trainer, load_workspace, prepare_workspace

METHODS = ("fedcache", "fedavg")
SCHEDULES = ("sync", "async")


def timed_run(params, method: str, part, ds, name: str) -> tuple[list[float], list[int]]:
    """(wall seconds of each round after the set-up, client uploads the server received in each)."""
    from pipeline.federation.ledger import UP

    trainer = fresh_trainer(params, method, part, ds, run_name=name)
    walls, updates = [], []
    try:
        first = trainer.start()
        for round_ in range(first, params.train.rounds + 1):
            start = time.perf_counter()
            trainer.run_round(round_)
            walls.append(time.perf_counter() - start)
            updates.append(_arrivals(trainer, round_, UP))
        trainer.finish()
    finally:
        trainer.close()
    return walls, updates


def _arrivals(trainer, round_: int, up: str) -> int:
    """Client updates that arrived in the round: under async the event log's arrivals in that span, under sync the
    clients whose upload the ledger counted."""
    loop = trainer.schedule
    if loop is not None:
        return sum(1 for e in loop.events() if e["span"] == round_ and e["event"] == "arrived")
    return len({k for (_, k, direction, _, _, _) in trainer.ledger.rows(round_) if direction == up})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (sync) and spans (async) of each run (default 3)")
    ap.add_argument("--repeats", type=int, default=2, help="sync/async pairs per method (default 2)")
    args = ap.parse_args()
    overrides = {"devices": {"enabled": True}, "fedcache": {"consistency": "round"},
                 "train": {"rounds": args.rounds, "threads": 1, "algorithms": list(METHODS), "hetero_algorithms": []}}
    work = prepare_workspace("async_cost", overrides, ("partition", "encode", "index"))
    base, part, ds = load_workspace(work)
    walls = {(m, s): [] for m in METHODS for s in SCHEDULES}
    updates = {(m, s): [] for m in METHODS for s in SCHEDULES}
    for rep in range(args.repeats):
        for method in METHODS:
            for schedule in SCHEDULES:  # alternated: sync, async, sync, async, ...
                params = base.model_copy(update={"train": base.train.model_copy(update={"schedule": schedule})})
                w, n = timed_run(params, method, part, ds, f"{method}-{schedule}")
                walls[method, schedule] += w
                updates[method, schedule] += n
                print(f"repeat {rep}: {method:8s} {schedule:5s} rounds {[round(x, 2) for x in w]} s, "
                      f"updates {n}", flush=True)
    print(f"\nK = {part.num_clients} clients, {args.rounds} rounds / spans each, {args.repeats} repeat(s), "
          f"torch threads 1, sync on the {base.train.executor} executor, async on the sequential one")
    print("| method | schedule | wall s / round (median) | updates / round (mean) | wall s / update | "
          "async / sync per round | async / sync per update |")
    print("|---|---|---|---|---|---|---|")
    for method in METHODS:
        per = {}
        for schedule in SCHEDULES:
            w, n = walls[method, schedule], updates[method, schedule]
            per[schedule] = (statistics.median(w), statistics.mean(n), sum(w) / max(1, sum(n)))
        for schedule in SCHEDULES:
            round_s, n, update_s = per[schedule]
            ratio = ("" if schedule == "sync" else
                     f"{round_s / per['sync'][0]:.2f}x | {update_s / per['sync'][2]:.2f}x")
            print(f"| {method} | {schedule} | {round_s:.2f} | {n:.1f} | {update_s:.3f} | "
                  f"{ratio if ratio else ' | '} |")


if __name__ == "__main__":
    main()
