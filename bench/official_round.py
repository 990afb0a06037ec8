"""Our FedCache demo round against the official FedCache code, side by side in one run (issue 39).

    git clone https://github.com/wuzhiyuan2000/FedCache /tmp/FedCache     # the official code, run unmodified
    .venv/bin/pip install hnswlib                                         # it needs hnswlib (this benchmark only)
    .venv/bin/python bench/official_round.py --official-dir /tmp/FedCache              # rounds 1 and 2, 25-30 min
    .venv/bin/python bench/official_round.py --official-dir /tmp/FedCache --threads 1  # both sides on 1 thread
    .venv/bin/python bench/official_round.py --skip-official                           # ours alone

What is measured, on the official code's demo setting (its defaults: K = 20 clients over all 60,000
FashionMNIST training images, Dirichlet alpha 1.0, A1/A2/A3 = ResNet-8/16/20 by client index mod 3, batch 8,
R = 16 neighbours, every client evaluated on its own test split every round), per round: train s, eval s and
their total, for three rows, each run in its own process (its threads and memory its own), one after another:

  official     its main_fedcache.py, run in-process with `--comm_round N --data_dir DIR`. Its own printed
               markers, stamped with a clock: a round starts at "communication round", its evaluation at the
               round's first "start tesing on client" (sic) and it ends at "mean Test/AccTop1 on all clients".
  ours, step   the library's Simulation (bench/torch_harness.py) over the same setting (the harness's `official`
               setting, our own Dirichlet partition of the same data), with params.yaml's defaults: its
               fedcache.consistency (`step`), train.executor (`vectorized`), train.group_size, train.side_by_side
               and train.precision (`auto`: bfloat16 on a CPU with AMX, float32 elsewhere; the row names what it
               resolved to). Train s is a round as bench/executors.py times it (downloads, local training,
               uploads, aggregation); eval s is `Simulation.evaluate` of every client on its own test split, timed
               after it.
  ours, round  the same with `round` consistency (the executors' benchmark's FedCache).
  ours, step, float32   where the default precision resolved to bfloat16: the default row once more in float32.
  ours, ..., groups in turn   where the groups run side by side (train.side_by_side, in lanes of one core each:
               pipeline/train/lanes.py): the default and `round` rows once more with them one after another.

Like with like: the official round includes its evaluation of every client, so the speed-up is given on the
totals (train + eval) and on train only. Both sides train on every one of the 60,000 images (our partition
holds none out for validation here: --val-holdout 0.1 is the harness's own `official` setting, 10% fewer) and
evaluate on all 10,000 test images; the official code drops each client's last partial batch of 8 (up to 7
images per client). Excluded on both sides: set-up (loading, partitioning, building the models; the
official code's MobileNet hashing of every image and its HNSW index; our neighbour search).

How the official code is adapted, at run time, without editing its files, and why its round computes the
same: it is written for CUDA and downloads its data and encoder weights, so
  - torch.Tensor.cuda and torch.nn.Module.cuda return the object itself: every tensor and model stays on the
    CPU, and the arithmetic is the same;
  - FedCache.mobilenet_v3_small (its set-up hash encoder, imported by name) is torchvision's
    mobilenet_v3_small(weights=None) with its parameters frozen, reading its 224 x 224 input pooled to 32 x 32:
    no download, no autograd graph (the code detaches the hashes), the same 576 features a sample, and an
    untimed set-up about 50x cheaper (at 224 it took 47 min of a loaded 2-core CPU). The hashes
    only choose which 16 same-label neighbours each image reads; a round reads 16 whatever they are, so its
    cost does not depend on the weights (its accuracy does: neighbours found by a random encoder are less
    alike, so the official row's accuracy is indicative only);
  - its FashionMNIST(download=True) finds the four IDX files already in torchvision's layout
    (DIR/FashionMNIST/raw/, decompressed here from data/raw or the Debian package) and downloads nothing.
Threads: each side at its best by default: the official code on every core (a quick check on a 2-core AMD
EPYC, near idle: its ResNet-8/16/20 training steps at batch 8 took 11-13 / 20-23 / 30-33 ms on 2 threads,
16.5 / 28-30 / 41-44 ms on 1), ours on its executor's own (params.yaml's train.threads; null: every core,
vectorized); --threads N puts both rows' rounds on N (the official set-up, untimed, still uses every core).
Writes the rows to bench/results/official-round-<cpu>.json (--json) and prints a markdown table. Runtime on
an idle 2-core CPU: roughly 20 min with 2 rounds (the official set-up: minutes, mostly its HNSW index). Measure on an idle machine.
"""

from __future__ import annotations

import argparse
import builtins
import datetime
import gzip
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# the official code's own prints that delimit a round (its spelling)
ROUND_MARK = "communication round"
EVAL_MARK = "start tesing on client"
DONE_MARK = "mean Test/AccTop1 on all clients"

OFFICIAL_THREADS = os.cpu_count() or 1  # faster than 1 for its batch-8 steps (the docstring's check)
HNSWLIB_MISSING = "the official FedCache code needs hnswlib: .venv/bin/pip install hnswlib (this benchmark only)"


# ------------------------------------------------------------------------------------------ the official code

class PrintLog:
    """Stands in for builtins.print: stamps each printed line with `clock`, then prints it (to `stream`)."""

    def __init__(self, clock=time.perf_counter, stream=None, on_line=None):
        self.clock, self.stream, self.on_line = clock, stream, on_line
        self.lines: list[tuple[float, str]] = []
        self.print = builtins.print  # the real one, whatever stands in later

    def __call__(self, *args, sep=" ", end="\n", file=None, flush=False):
        text = (" " if sep is None else sep).join(str(a) for a in args)
        self.lines.append((self.clock(), text))
        if self.on_line:
            self.on_line(text)
        self.print(*args, sep=sep, end=end, file=file or self.stream, flush=flush)


def official_rounds(lines: list[tuple[float, str]], end: float) -> list[dict]:
    """Each round's seconds from the official code's stamped prints: train (round start to its first evaluated
    client), eval (to the mean over all clients) and total; acc: that mean, as a fraction. A round that
    evaluates nothing (its --interval) ends where the next starts, the last at `end`."""
    marks: list[dict] = []
    for t, text in lines:
        if ROUND_MARK in text:
            marks.append({"start": t, "eval": None, "done": None, "acc": None})
        elif marks and EVAL_MARK in text and marks[-1]["eval"] is None:
            marks[-1]["eval"] = t
        elif marks and DONE_MARK in text:
            marks[-1]["done"] = t
            marks[-1]["acc"] = float(text.rsplit(":", 1)[1]) / 100  # it prints percent
    rounds = []
    for i, m in enumerate(marks):
        stop = m["done"] or (marks[i + 1]["start"] if i + 1 < len(marks) else end)
        train_end = m["eval"] or stop
        rounds.append({"round": i + 1, "train_s": train_end - m["start"], "eval_s": stop - train_end,
                       "total_s": stop - m["start"], "acc": m["acc"]})
    return rounds


def official_samples(lines: list[tuple[float, str]], batch: int = 8) -> dict:
    """The samples a round trains and evaluates: its per-client batch counts (printed at set-up) x its batch
    size (--batch_size, 8 by default; the last partial batch of each client is dropped)."""
    found = {"train": 0, "test": 0}
    for _, text in lines:
        for split in found:
            match = re.search(rf"batch_num_{split}_local = (\d+)", text)
            if match:
                found[split] += int(match.group(1)) * batch
    return {"train_samples": found["train"], "test_samples": found["test"]}


def fashion_mnist_dir(dest: Path, sources: list[Path]) -> Path:
    """torchvision's FashionMNIST layout under `dest` (FashionMNIST/raw/ with the four IDX files, uncompressed),
    from the first of `sources` holding each file (plain or .gz), so FashionMNIST(dest, download=True) finds
    them and downloads nothing. Returns `dest`."""
    from pipeline.data.datasets import IDX_FILES

    raw = dest / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for stem in IDX_FILES:
        target = raw / stem
        if target.is_file():
            continue
        found = next((p for d in sources for p in (d / stem, d / f"{stem}.gz") if p.is_file()), None)
        if found is None:
            sys.exit(f"FashionMNIST's {stem}(.gz) is in none of {', '.join(map(str, sources))}: "
                     "sudo apt-get install dataset-fashion-mnist, or copy the four .gz files into data/raw")
        data = found.read_bytes()
        if data[:2] == b"\x1f\x8b":  # gzip magic: by content, not by suffix
            data = gzip.decompress(data)
        partial = target.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(target)  # never a half-written file where torchvision looks
    return dest


def data_sources() -> list[Path]:
    from pipeline.data.datasets import DEBIAN_FASHION_MNIST_DIR

    raw = ROOT / "data" / "raw"
    return [raw, raw / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST_DIR]


def run_official(official_dir: Path, data_dir: Path, rounds: int, threads: int) -> dict:
    """The official main_fedcache.py in this process, adapted as the module docstring says; its rounds' seconds."""
    import torch
    import torchvision

    try:
        import hnswlib  # noqa: F401 - its FedCache.py imports it; say how to get it before it fails there
    except ImportError:
        sys.exit(HNSWLIB_MISSING)
    main = official_dir / "main_fedcache.py"
    sys.path.insert(0, str(official_dir))  # its modules import each other by name
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    import FedCache  # the official module, before its main imports it, to replace the encoder it looks up

    def encoder(*args, **kwargs):
        """Random weights, frozen (no graph it would detach anyway), on its 224 x 224 input pooled to 32 x 32: the
        same 576 features a sample (the untimed set-up ~50x cheaper: it took 47 min of a loaded CPU at 224)."""
        net = torchvision.models.mobilenet_v3_small(weights=None).requires_grad_(False)
        net.features = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(32), net.features)
        return net

    FedCache.mobilenet_v3_small = encoder

    torch.set_num_threads(os.cpu_count() or 1)  # set-up (untimed) on every core; the rounds on `threads`

    def on_line(text: str) -> None:
        if ROUND_MARK in text:
            torch.set_num_threads(threads)

    log = PrintLog(stream=sys.stderr, on_line=on_line)  # its prints to stderr: progress, not our result
    sys.argv = [str(main), "--comm_round", str(rounds), "--data_dir", str(data_dir)]
    start = time.perf_counter()
    builtins.print = log
    try:
        runpy.run_path(str(main), run_name="__main__")
    finally:
        builtins.print = log.print
    end = time.perf_counter()
    per_round = official_rounds(log.lines, end)
    setup_s = next(t for t, text in log.lines if ROUND_MARK in text) - start
    return {"row": "official", "rounds": per_round, "setup_s": setup_s, "threads": threads,
            **official_samples(log.lines), "argv": sys.argv[1:]}


# ------------------------------------------------------------------------------------------------------- ours

def our_defaults():
    """params.yaml's validated train and fedcache sections (the schema's defaults where it says nothing)."""
    sys.path.insert(0, str(ROOT))
    from pipeline.config import load_params

    return load_params(ROOT / "params.yaml", ["fedcache"])


def run_ours(consistency: str, precision: str, rounds: int, threads: int | None, val_holdout: float,
             in_turn: bool = False) -> dict:
    """The library's FedCache over the harness's official setting with params.yaml's executor, in `precision`
    (float32 or bfloat16); per round, the training round (as bench/executors.py times it) and the evaluation of
    every client on its test split. in_turn: train.side_by_side off (lockstep groups one after another)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import torch_harness as h

    from pipeline.train.engine import Timer, make_executor

    start = time.perf_counter()
    params = our_defaults()
    params = params.model_copy(update={"fedcache": params.fedcache.model_copy(update={"consistency": consistency})})
    if in_turn:
        params = params.model_copy(update={"train": params.train.model_copy(update={"side_by_side": False})})
    if params.train.executor == "dask":
        sys.exit("params.yaml's train.executor is dask: time it with bench/executors.py --executors dask")
    setting = dict(h.SETTINGS["official"], val_holdout=val_holdout)
    sim, part = h.build(setting, consistency, "cpu", params.train.group_size, synthetic=False, precision=precision)
    # the executor the pipeline would pick for these params (it says so when it falls back to sequential)
    sim.executor = make_executor(params, h.HarnessFedCache, sim.local)
    threads = threads or params.train.threads or sim.executor.threads
    torch.set_num_threads(threads)
    setup_s = time.perf_counter() - start
    selected = list(range(len(sim.clients)))
    out = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        sim.run_round(r, selected, Timer())
        trained = time.perf_counter()
        rows, _ = sim.evaluate(r)
        done = time.perf_counter()
        out.append({"round": r, "train_s": trained - start, "eval_s": done - trained, "total_s": done - start,
                    "acc": float(np.mean([acc for _, acc, _ in rows]))})
        print(f"ours {consistency} round {r}: train {out[-1]['train_s']:.1f} s, eval {out[-1]['eval_s']:.1f} s",
              file=sys.stderr, flush=True)
    return {"row": f"ours, {consistency}, {precision}" + (", groups in turn" if in_turn else ""),
            "precision": precision, "rounds": out, "threads": threads,
            "train_samples": part.num_train,
            "test_samples": len(part.test_index), "setup_s": setup_s,
            "executor": type(sim.executor).__name__, "consistency": consistency}


def ours_runs(consistency: str, precision: str, side_by_side: bool) -> list[tuple[str, str, bool]]:
    """(consistency, precision, in turn) of our rows: the default first, in the default precision, then `round`
    (once if the default is `round`); where the default precision is not float32, the default once more in
    float32, the reference arithmetic; where the groups run side by side (train.side_by_side: in lanes with either
    consistency), the default and `round` once more with their groups in turn."""
    both = list(dict.fromkeys([consistency, "round"]))
    runs = [(c, precision, False) for c in both]
    runs += [(consistency, "float32", False)] if precision != "float32" else []
    return runs + ([(c, precision, True) for c in both] if side_by_side else [])


# ------------------------------------------------------------------------------------------------- the table

def speedups(base: dict | None, row: dict, key: str) -> list[float | None]:
    """The official round's seconds over this row's, per round (None where either is missing)."""
    if base is None:
        return [None for _ in row["rounds"]]
    return [b[key] / r[key] if r[key] > 0 else None for b, r in zip(base["rounds"], row["rounds"])]


def markdown(header: dict, rows: list[dict]) -> str:
    rounds = max(len(r["rounds"]) for r in rows)
    base = next((r for r in rows if r["row"] == "official"), None)
    cols = [f"round {i} {part} s" for i in range(1, rounds + 1) for part in ("train", "eval", "total")]
    lines = [f"# FedCache demo round: the official code against ours ({header['date']})", "",
             f"CPU: {header['cpu']}; load average at start {header['load_start']}, at end {header['load_end']}.  ",
             f"Setting: {header['setting']}.  ", f"Threads: {header['threads']}.  ",
             f"Command: `{header['command']}`", "",
             "| row | threads | samples trained / evaluated | " + " | ".join(cols)
             + " | speed-up per round, total | speed-up per round, train only | mean acc after last round |",
             "|---" * (len(cols) + 6) + "|"]
    for row in rows:
        cells = [f"{r[k]:.1f}" for r in row["rounds"] for k in ("train_s", "eval_s", "total_s")]
        cells += [""] * (len(cols) - len(cells))

        def fmt(values: list[float | None], row=row) -> str:
            if base is None or row is base:
                return ""
            return " / ".join("-" if v is None else f"**{v:.2f}x**" for v in values)

        acc = row["rounds"][-1]["acc"]
        samples = f"{row['train_samples']:,} / {row['test_samples']:,}"
        lines.append(f"| {row['row']} | {row['threads']} | {samples} | " + " | ".join(cells)
                     + f" | {fmt(speedups(base, row, 'total_s'))} | {fmt(speedups(base, row, 'train_s'))} | "
                     + ("" if acc is None else f"{acc:.4f}") + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------ main

def in_subprocess(args, *extra: str) -> dict:
    """One row in a fresh process of this script; its progress to our stderr, its result through a file."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--rounds", str(args.rounds),
               "--val-holdout", str(args.val_holdout), "--_out", str(result), *extra]
        if subprocess.run(cmd, cwd=ROOT, check=False).returncode != 0:
            sys.exit(f"this run failed (its output is above): {shlex.join(cmd)}")
        return json.loads(result.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--official-dir", type=Path, help="a checkout of github.com/wuzhiyuan2000/FedCache")
    ap.add_argument("--skip-official", action="store_true", help="time ours alone")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, help="torch threads of every row (default: each side at its best)")
    ap.add_argument("--data-dir", type=Path, default=HERE / ".work" / "official_round" / "data",
                    help="where the official code finds FashionMNIST (built here from data/raw or the Debian files)")
    ap.add_argument("--val-holdout", type=float, default=0.0,
                    help="our partition's validation share (0: train on all 60,000 like the official code)")
    ap.add_argument("--json", type=Path, help="where the rows go (default bench/results/official-round-<cpu>.json)")
    ap.add_argument("--_run", choices=["official", "ours"], help=argparse.SUPPRESS)  # internal: one row here
    ap.add_argument("--_consistency", help=argparse.SUPPRESS)
    ap.add_argument("--_precision", help=argparse.SUPPRESS)
    ap.add_argument("--_in_turn", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._run:
        row = (run_official(args.official_dir, args.data_dir, args.rounds, args.threads) if args._run == "official"
               else run_ours(args._consistency, args._precision, args.rounds, args.threads, args.val_holdout,
                             args._in_turn))
        args._out.write_text(json.dumps(row))
        return

    sys.path.insert(0, str(ROOT))
    from roofline import cpu_slug

    from pipeline.machine import cpu_description
    from pipeline.train.precision import resolved_precision

    if not args.skip_official:
        if args.official_dir is None:
            ap.error("--official-dir DIR (git clone https://github.com/wuzhiyuan2000/FedCache DIR), or --skip-official")
        import importlib.util

        if importlib.util.find_spec("hnswlib") is None:
            sys.exit(HNSWLIB_MISSING)
        if not (args.official_dir / "main_fedcache.py").is_file():
            sys.exit(f"no main_fedcache.py in {args.official_dir}: "
                     f"git clone https://github.com/wuzhiyuan2000/FedCache {args.official_dir}")
        fashion_mnist_dir(args.data_dir, data_sources())
    defaults = our_defaults()
    default = defaults.fedcache.consistency
    default_precision = resolved_precision(defaults.train.precision, "cpu")  # auto: by this CPU
    header = {"date": datetime.date.today().isoformat(), "cpu": cpu_description(),
              "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
              "setting": "the official demo: K = 20 over all 60,000 FashionMNIST images, Dirichlet alpha 1.0, "
                         "A1/A2/A3 = ResNet-8/16/20 by client index mod 3, batch 8, R = 16, every client evaluated "
                         f"on its own test split every round; {args.rounds} round(s); set-up not timed",
              "threads": f"{args.threads} on every row" if args.threads else
                         f"official {OFFICIAL_THREADS}, ours its executor's own (params.yaml's train.threads)",
              "command": shlex.join(["python", "bench/official_round.py", *sys.argv[1:]])}
    rows = []
    if not args.skip_official:
        rows.append(in_subprocess(args, "--_run", "official", "--official-dir", str(args.official_dir.resolve()),
                                  "--data-dir", str(args.data_dir.resolve()),
                                  "--threads", str(args.threads or OFFICIAL_THREADS)))
    for consistency, precision, in_turn in ours_runs(default, default_precision, defaults.train.side_by_side):
        extra = ["--threads", str(args.threads)] if args.threads else []
        extra += ["--_in_turn"] if in_turn else []
        row = in_subprocess(args, "--_run", "ours", "--_consistency", consistency, "--_precision", precision, *extra)
        row["row"] += " (default)" if (consistency, precision, in_turn) == (default, default_precision, False) else ""
        rows.append(row)
    header["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())

    table = markdown(header, rows)
    print("\n" + table)
    out = args.json or HERE / "results" / f"official-round-{cpu_slug()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**header, "rows": rows}, indent=1) + "\n")
    print(f"rows written to {out}")


if __name__ == "__main__":
    main()
