"""Executors side by side: seconds per round, speed-up, accuracy, memory.

    .venv/bin/python bench/executors.py --setting official --rounds 3          # K=20, all 60k, A1/A2/A3
    .venv/bin/python bench/executors.py --setting paper --rounds 1             # K=300, all 60k, ResNet-20
    python3 bench/executors.py --setting paper --device cuda --rounds 3        # on a GPU (bench/gpu_check.sh)
    .venv/bin/python bench/executors.py --setting official --methods fedcache fedavg --executors sequential dask dask-separate

Each executor runs in its own process (so peak memory is its own) on the same partition and
initial weights; FedCache uses `round` consistency, whose sequential and vectorized runs compute
the same thing (`step`, the vectorized lockstep, is measured with --consistency step). Torch
and numpy only (bench/torch_harness.py): it runs on a bare GPU machine too. Prints a markdown
table; round times exclude evaluation and one-time set-up; accuracy is the mean over clients
of each client's own test split after the last round.

`dask` is the dask executor with a local cluster of --dask-workers worker processes (1 thread
each) that it starts itself; `dask-separate` joins a scheduler and --dask-workers workers this
script starts as separate processes on 127.0.0.1 (`dask scheduler`, `dask worker`: the layout of
several machines, on one) and stops afterwards. Both need the venv (Prefect, Dask); their round
times exclude starting the cluster (its own column) but include each worker's first task. The
`fedavg` method trains ResNet-8 on every client (FedAvg averages weights: one architecture).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pipeline.train.executors import SequentialExecutor, VectorizedExecutor  # noqa: E402

DASK_EXECUTORS = ("dask", "dask-separate")


def build_fedavg(setting: str, device: str, group_size: int, synthetic: bool, seed: int = 0):
    """The harness's partition and clients with the library's FedAvg (ResNet-8 on every client)."""
    import torch_harness as h

    from pipeline.methods.fedavg.method import FedAvg

    params = h.bench_params("resnet8", "round", group_size, seed)  # its fedavg section: personalized evaluation
    return h.simulation(FedAvg, setting, params, device, synthetic, seed)


def make_executor(args):
    if args.executor == "sequential":
        return SequentialExecutor()
    if args.executor == "vectorized":
        return VectorizedExecutor(args.group_size)
    import flows  # noqa: F401  (Prefect's offline-safe settings, as in a stage)
    from pipeline.train.dask_executor import DaskExecutor

    if args.executor == "dask":
        return DaskExecutor(workers=args.dask_workers)
    return DaskExecutor(address=args.dask_address)


def one_run(args) -> dict:
    import torch

    import torch_harness as h

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    if args.method == "fedavg":
        sim, part = build_fedavg(args.setting, args.device, args.group_size, args.synthetic)
    else:
        sim, part = h.build(args.setting, args.consistency, args.device, args.group_size, args.synthetic)
    setup_s = time.perf_counter() - start
    executor = sim.executor = make_executor(args)
    try:
        start = time.perf_counter()
        if hasattr(executor, "start"):
            executor.start()  # the cluster, and the Prefect API its task runs report to
        cluster_s = time.perf_counter() - start
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        seconds = h.timed_rounds(sim, args.rounds, args.device)
        stats = getattr(executor, "last_round", None)
    finally:
        if hasattr(executor, "close"):
            executor.close()
    out = {"executor": args.executor, "method": args.method, "round_s": seconds, "acc": h.mean_accuracy(sim),
           "setup_s": setup_s, "cluster_s": cluster_s, "clients": part.num_clients, "samples": part.num_train,
           "bytes": sim.ledger.total(),
           "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    if stats:
        out["dask"] = dask_summary(stats)
    if args.device.startswith("cuda"):
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def dask_summary(stats: dict) -> dict:
    """The last round on the cluster: wall time against the workers' own compute, and what travelled."""
    per_worker: dict[str, float] = {}
    for c in stats["clients"].values():
        per_worker[c["worker"]] = per_worker.get(c["worker"], 0.0) + c["seconds"]
    busiest = max(per_worker.values())
    return {"workers": len(per_worker), "wall_s": stats["wall_s"], "busiest_worker_s": busiest,
            "compute_s": sum(per_worker.values()), "overhead_s": stats["wall_s"] - busiest,
            "mb_to": sum(c["bytes_to"] for c in stats["clients"].values()) / 1e6,
            "mb_back": sum(c["bytes_back"] for c in stats["clients"].values()) / 1e6}


@contextmanager
def separate_cluster(workers: int, log_dir: Path):
    """`dask scheduler` and `workers` x `dask worker` (1 thread each) as separate processes on 127.0.0.1;
    yields the scheduler's address; stops every process it started (process groups), also on errors."""
    from distributed import Client

    dask = Path(sys.executable).with_name("dask")
    procs: list[subprocess.Popen] = []

    def spawn(name: str, *cmd: str) -> subprocess.Popen:
        with open(log_dir / f"{name}.log", "w") as log:
            p = subprocess.Popen([str(dask), *cmd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(p)
        return p

    try:
        info = log_dir / "scheduler.json"
        info.unlink(missing_ok=True)
        scheduler = spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(info))
        deadline = time.monotonic() + 180
        address = None
        while address is None:
            try:
                address = json.loads(info.read_text())["address"]
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                if scheduler.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the dask scheduler did not start: {(log_dir / 'scheduler.log').read_text()[-2000:]}")
                time.sleep(0.2)
        for i in range(workers):
            spawn(f"worker{i}", "worker", address, "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
                  "--no-dashboard", "--name", f"worker{i}")
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=300)
        yield address
    finally:
        for p in procs:
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setting", choices=["official", "paper", "default", "small"], default="official")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of every run (default: each executor's own, 1 sequential, all cores vectorized)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--consistency", choices=["round", "step"], default="round")
    ap.add_argument("--methods", nargs="+", choices=["fedcache", "fedavg"], default=["fedcache"])
    ap.add_argument("--executors", nargs="+", default=["sequential", "vectorized"],
                    choices=["sequential", "vectorized", *DASK_EXECUTORS])
    ap.add_argument("--dask-workers", type=int, default=2, help="worker processes of the dask runs (1 thread each)")
    ap.add_argument("--seq-rounds", type=int, default=None, help="rounds of the sequential run (default --rounds)")
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--executor", help=argparse.SUPPRESS)  # internal: one run in this process
    ap.add_argument("--method", default="fedcache", help=argparse.SUPPRESS)
    ap.add_argument("--dask-address", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.executor:
        print(json.dumps(one_run(args)))
        return

    print(f"# rounds of {', '.join(args.methods)}, setting {args.setting}, device {args.device}, batch 8, group size "
          f"{args.group_size}, FedCache consistency {args.consistency}, {os.cpu_count()} cores", flush=True)
    results = []
    logs = Path(tempfile.mkdtemp(prefix="bench-dask-"))
    for method in args.methods:
        for name in args.executors:
            default_threads = SequentialExecutor.threads if name == "sequential" else (os.cpu_count() or 1)
            threads = args.threads or default_threads
            rounds = args.seq_rounds if (name == "sequential" and args.seq_rounds) else args.rounds
            consistency = "round" if (name == "sequential" and args.consistency == "step") else args.consistency
            cmd = [sys.executable, str(Path(__file__)), "--setting", args.setting, "--rounds", str(rounds),
                   "--threads", str(threads), "--device", args.device, "--group-size", str(args.group_size),
                   "--consistency", consistency, "--executor", name, "--method", method,
                   "--dask-workers", str(args.dask_workers)] + (["--synthetic"] if args.synthetic else [])
            with (separate_cluster(args.dask_workers, logs) if name == "dask-separate" else suppress()) as address:
                out = subprocess.run(cmd + (["--dask-address", address] if address else []), capture_output=True,
                                     text=True, cwd=HERE)
            if out.returncode != 0:
                sys.exit(f"{method} {name} run failed:\n{out.stderr[-3000:]}")
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["threads"] = threads
            results.append(run)
            print(f"{method} {name}: rounds {['%.1f' % s for s in run['round_s']]} s, mean acc {run['acc']:.4f}",
                  flush=True)

    print(f"\nK = {results[0]['clients']} clients, {results[0]['samples']:,} training samples; dask: "
          f"{args.dask_workers} worker processes x 1 thread; peak RSS of the process running the rounds "
          "(not the dask workers)\n")
    gpu = args.device.startswith("cuda")
    print("| method | executor | threads | s / round (best) | speed-up | mean acc after last round | peak RSS GB |"
          " cluster start s | dask: busiest worker s (all workers), overhead s, MB to / back (last round) |"
          + (" peak GPU GB | 1,000 rounds |" if gpu else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""))
    for method in args.methods:
        runs = [r for r in results if r["method"] == method]
        base = min(runs[0]["round_s"])
        for r in runs:
            best = min(r["round_s"])
            d = r.get("dask")
            dask_cell = (f"{d['busiest_worker_s']:.1f} ({d['compute_s']:.1f}), {d['overhead_s']:.1f}, "
                         f"{d['mb_to']:.0f} / {d['mb_back']:.0f}"
                         if d else "")
            cluster = f"{r['cluster_s']:.1f}" if r["executor"] in DASK_EXECUTORS else ""
            line = (f"| {method} | {r['executor']} | {r['threads']} | {best:.2f} | {base / best:.2f}x | {r['acc']:.4f} "
                    f"(after {len(r['round_s'])}) | {r['peak_rss_gb']:.2f} | {cluster} | {dask_cell} |")
            if gpu:
                line += f" {r['peak_gpu_gb']:.2f} | {best * 1000 / 60:.1f} min |"
            print(line)


if __name__ == "__main__":
    main()
