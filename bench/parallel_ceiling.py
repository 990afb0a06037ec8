"""What two processes can gain on this machine: the ceiling for any 2-worker executor.

    .venv/bin/python bench/parallel_ceiling.py [--models resnet8 resnet20] [--samples 3000]

For each model, one local epoch (batch 8, SGD, 1 torch thread) over `--samples` random 28x28
images is timed in one process alone, then in two processes started together (each its own
copy of the same work). The ceiling is 2 x (alone) / (slower of the pair): 2.0 when two cores
run two trainings as fast as one, lower when they slow each other down (shared caches, memory
bandwidth, a host's hyper-threads behind the VM's cores). An executor that spreads clients over
2 worker processes cannot beat it. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORK = """
import json, sys, time, torch
sys.path.insert(0, {root!r})
from models.resnet import build_model
torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model({model!r}, 1, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.rand({n}, 1, 28, 28), torch.randint(0, 10, ({n},))
ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
import os
while not os.path.exists(go):
    time.sleep(0.001)
start = time.perf_counter()
for i in range(0, {n}, 8):
    loss = torch.nn.functional.cross_entropy(model(x[i:i + 8]), y[i:i + 8])
    opt.zero_grad(); loss.backward(); opt.step()
print(json.dumps(time.perf_counter() - start))
"""


def timed(model: str, n: int, copies: int, tmp: Path) -> list[float]:
    code = WORK.format(root=str(ROOT), model=model, n=n)
    go = tmp / "go"
    go.unlink(missing_ok=True)
    procs, readies = [], []
    for i in range(copies):
        ready = tmp / f"ready{i}"
        ready.unlink(missing_ok=True)
        readies.append(ready)
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(ready), str(go)], stdout=subprocess.PIPE,
                                      text=True))
    while not all(r.exists() for r in readies):  # every process imported torch and built its model
        time.sleep(0.01)
    go.touch()
    return [json.loads(p.communicate()[0]) for p in procs]


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["resnet8", "resnet20"])
    ap.add_argument("--samples", type=int, default=3000, help="samples per epoch (3000: a client of K=20 over 60k)")
    args = ap.parse_args()
    print(f"one epoch of {args.samples} samples, batch 8, 1 thread per process")
    print("| model | alone s | pair s (each) | ceiling for 2 workers |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for model in args.models:
            alone = timed(model, args.samples, 1, Path(d))[0]
            pair = timed(model, args.samples, 2, Path(d))
            print(f"| {model} | {alone:.1f} | {pair[0]:.1f} / {pair[1]:.1f} | {2 * alone / max(pair):.2f}x |", flush=True)


if __name__ == "__main__":
    main()
