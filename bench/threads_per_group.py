"""Two cores for grouped training: both torch threads on each group in turn, or one group on each core?

    .venv/bin/python bench/threads_per_group.py                       # ResNet-8/16/20, groups of 7, 5 repeats
    .venv/bin/python bench/threads_per_group.py --models resnet20 --clients 4 --steps 10
    .venv/bin/python bench/threads_per_group.py --precision bfloat16      # forward + loss in bfloat16 autocast

The vectorized executor steps its groups (one grouped network per architecture, models/grouped.py) one after
another, each on every torch thread (intra-op parallelism). At batch 8 a client the convolutions are small, so
two threads may not halve a step. The other way to use 2 cores: two groups at once, each in its own Python
thread on 1 torch thread (inter-op). This times both on the same two groups of `--clients` clients (random
1 x 28 x 28 data, batch 8, cross-entropy, GroupedSGD with momentum 0.9 and weight decay 5e-4):

  in turn, 2 torch threads       group 1's `--steps` steps, then group 2's, torch.set_num_threads(2)
  side by side, 1 thread each    both groups' steps at once in two Python threads, torch.set_num_threads(1)

Repeats are interleaved and the best kept (other work only ever slows a repeat down); printed: samples/s of
each and their ratio. Model compute only: no data loading, no exchange. The vectorized executor does the second
where its groups run in lockstep (train.side_by_side, pipeline/train/lanes.py). Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # the models, and the sibling bench modules

import torch  # noqa: E402

from grouped_speed import BATCH, grouped_step  # noqa: E402
from models.resnet import ARCHITECTURES  # noqa: E402


class Group:
    """One grouped network of `clients` same-architecture clients and its step (bench/grouped_speed.py: random
    1 x 28 x 28 batch, cross-entropy, GroupedSGD)."""

    def __init__(self, model: str, clients: int, precision: str = "float32"):
        self.step = grouped_step(clients, channels_last=False, model=model, precision=precision)
        self.net = self.step.net

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.step()


def in_turn(groups: list[Group], steps: int) -> float:
    """Seconds for every group's steps one group after another on 2 torch threads."""
    torch.set_num_threads(2)
    start = time.perf_counter()
    for g in groups:
        g.steps(steps)
    return time.perf_counter() - start


def side_by_side(groups: list[Group], steps: int) -> float:
    """Seconds for every group's steps at once, one Python thread and 1 torch thread each."""
    torch.set_num_threads(1)
    workers = [threading.Thread(target=g.steps, args=(steps,)) for g in groups]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def measure(model: str, clients: int, steps: int, repeats: int, precision: str = "float32") -> dict:
    torch.manual_seed(0)
    groups = [Group(model, clients, precision), Group(model, clients, precision)]
    for way in (in_turn, side_by_side):
        way(groups, 2)  # warm-up: allocations, oneDNN primitives for this thread count
    best = {"in_turn": float("inf"), "side_by_side": float("inf")}
    for _ in range(repeats):
        best["in_turn"] = min(best["in_turn"], in_turn(groups, steps))
        best["side_by_side"] = min(best["side_by_side"], side_by_side(groups, steps))
    samples = 2 * clients * BATCH * steps
    return {"model": model, "clients": clients, "steps": steps, "repeats": repeats, "precision": precision,
            "in_turn": samples / best["in_turn"], "side_by_side": samples / best["side_by_side"],
            "ratio": best["in_turn"] / best["side_by_side"]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(ARCHITECTURES), default=list(ARCHITECTURES))
    ap.add_argument("--clients", type=int, default=7, help="clients in each of the two groups (the demo's: 6-7)")
    ap.add_argument("--steps", type=int, default=20, help="steps of each group per timed repeat")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats, the best kept")
    ap.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                    help="the forward and loss's arithmetic (train.precision; bfloat16 pays on a CPU with AMX)")
    args = ap.parse_args(argv)
    threads_before = torch.get_num_threads()
    rows = []
    try:
        print(f"two groups of {args.clients} clients, batch {BATCH}, {args.steps} steps each, best of {args.repeats}, "
              f"{args.precision}")
        print("| model | in turn, 2 torch threads | side by side, 1 thread each | side by side / in turn |")
        print("|---|---:|---:|---:|")
        for model in args.models:
            row = measure(model, args.clients, args.steps, args.repeats, args.precision)
            rows.append(row)
            print(f"| {model} | {row['in_turn']:.0f} samples/s | {row['side_by_side']:.0f} samples/s | "
                  f"{row['ratio']:.2f}x |", flush=True)
    finally:
        torch.set_num_threads(threads_before)
    return rows


if __name__ == "__main__":
    main()
