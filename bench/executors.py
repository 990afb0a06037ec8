"""Sequential vs vectorized executor, side by side: seconds per FedCache round, speed-up, accuracy, memory.

    .venv/bin/python bench/executors.py --setting official --rounds 3          # K=20, all 60k, A1/A2/A3
    .venv/bin/python bench/executors.py --setting paper --rounds 1             # K=300, all 60k, ResNet-20
    python3 bench/executors.py --setting paper --device cuda --rounds 3        # on a GPU (bench/gpu_check.sh)

Each executor runs in its own process (so peak memory is its own) on the same partition and
initial weights; FedCache uses `round` consistency, whose sequential and vectorized runs compute
the same thing (`step`, the vectorized lockstep, is measured with --consistency step). Torch
and numpy only (bench/torch_harness.py): it runs on a bare GPU machine too. Prints a markdown
table; round times exclude evaluation and one-time set-up; accuracy is the mean over clients
of each client's own test split after the last round.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pipeline.executors import SequentialExecutor, VectorizedExecutor  # noqa: E402


def one_run(args) -> dict:
    import torch

    import torch_harness as h

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    method, executor, part = h.build(args.setting, args.executor, args.consistency, args.device, args.group_size,
                                     args.synthetic)
    setup_s = time.perf_counter() - start
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    seconds = h.timed_rounds(method, executor, args.rounds, args.device)
    out = {"executor": args.executor, "round_s": seconds, "acc": h.mean_accuracy(method), "setup_s": setup_s,
           "clients": part.num_clients, "samples": part.num_train, "bytes": method.ctx.ledger.total(),
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if args.device.startswith("cuda"):
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=["official", "paper", "default", "small"], default="official")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of every run (default: each executor's own, 1 sequential, all cores vectorized)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--consistency", choices=["round", "step"], default="round")
    ap.add_argument("--executors", nargs="+", default=["sequential", "vectorized"])
    ap.add_argument("--seq-rounds", type=int, default=None, help="rounds of the sequential run (default --rounds)")
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--executor", help=argparse.SUPPRESS)  # internal: one run in this process
    args = ap.parse_args()
    if args.executor:
        print(json.dumps(one_run(args)))
        return

    print(f"# FedCache rounds, setting {args.setting}, device {args.device}, batch 8, group size {args.group_size}, "
          f"consistency {args.consistency}", flush=True)
    results = []
    for name in args.executors:
        threads = args.threads or (SequentialExecutor.threads if name == "sequential" else VectorizedExecutor.threads)
        rounds = args.seq_rounds if (name == "sequential" and args.seq_rounds) else args.rounds
        consistency = "round" if (name == "sequential" and args.consistency == "step") else args.consistency
        cmd = [sys.executable, str(Path(__file__)), "--setting", args.setting, "--rounds", str(rounds),
               "--threads", str(threads), "--device", args.device, "--group-size", str(args.group_size),
               "--consistency", consistency, "--executor", name] + (["--synthetic"] if args.synthetic else [])
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
        if out.returncode != 0:
            sys.exit(f"{name} run failed:\n{out.stderr[-3000:]}")
        run = json.loads(out.stdout.strip().splitlines()[-1])
        run["threads"] = threads
        results.append(run)
        print(f"{name}: rounds {['%.1f' % s for s in run['round_s']]} s, mean acc {run['acc']:.4f}", flush=True)

    base = min(results[0]["round_s"])
    print(f"\nK = {results[0]['clients']} clients, {results[0]['samples']:,} training samples\n")
    print("| executor | threads | s / round (best) | speed-up | mean acc after last round | peak RSS GB |"
          + (" peak GPU GB | 1,000 rounds |" if args.device.startswith("cuda") else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if args.device.startswith("cuda") else ""))
    for r in results:
        best = min(r["round_s"])
        line = (f"| {r['executor']} | {r['threads']} | {best:.2f} | {base / best:.2f}x | {r['acc']:.4f} "
                f"(after {len(r['round_s'])}) | {r['peak_rss_gb']:.2f} |")
        if args.device.startswith("cuda"):
            line += f" {r['peak_gpu_gb']:.2f} | {best * 1000 / 60:.1f} min |"
        print(line)


if __name__ == "__main__":
    main()
