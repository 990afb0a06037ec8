"""How cost grows with the number of clients K: one round's seconds per client-sample and peak memory (issue 39).

    .venv/bin/python bench/scaling.py                                               # the grid below (idle machine)
    .venv/bin/python bench/scaling.py --ks 20 --samples-per-client 20 --synthetic   # a smoke test, about a minute
    .venv/bin/python bench/scaling.py --executor sequential --rounds 2 --eval

The grid: K = 20, 100, 300 clients x models (homo: ResNet-8, A1, on every client; hetero: A1/A2/A3 =
ResNet-8/16/20 by client index, as the official FedCache code) x method (FedCache, FedAvg). Every client holds
--samples-per-client training samples on average (default 200, the paper's 60,000 / 300; a Dirichlet(1.0) label
mix), so the samples a round trains grow with K, and a cost linear in samples is a constant s / client-sample.
At K = 300 x 200 the partition uses all 60,000 FashionMNIST samples and, as the pipeline does, each client keeps
10% of each class it holds (rounded down) as its validation split, so about 55,000 are trained; below that,
validation comes from unused samples. FedAvg averages weights, so it needs one architecture: its hetero cells are
skipped, saying why (FedAvg's own declaration, pipeline/methods/fedavg/params.py, is read).

Each cell runs in its own process, so its peak resident memory (ru_maxrss) is its own: the dataset, every client's
data, model and optimizer, FedCache's relations and cache, the round. It runs the library's Simulation, executors
and clients through bench/torch_harness.py (torch and numpy only). Per cell:

  round s            the last of --rounds timed rounds: downloads, local training, uploads, aggregation
  server s           of which the server half and the byte ledger (the engine's "exchange" timer): FedCache's
                     gather of every sample's R = 16 neighbours' logits, FedAvg's weighted mean of the K models
  s / client-sample  round s / the samples that round trained (local epochs x every client's training samples)
  peak RSS GiB       the process's peak over set-up and the rounds (and evaluation, with --eval)
  set-up s           data, partition, clients' models, FedCache's relations (an exact top-k per label, not faiss)
  eval s             --eval only: one evaluation of every client's test split after the rounds
  groups             vectorized: the grouped networks a round trains (by architecture, up to --group-size clients)

Then a trend per (method, models): s / client-sample at the largest K against the smallest; within +-25% is
linear in samples, otherwise it says which way, and what the figures show about why (a least-squares fit's fixed
seconds per round, the groups' sizes, the server's seconds per sample). Then the paper-scale check: the K = 300
hetero cell's peak memory against the 4 GiB it must fit in.

Excluded: set-up from round s, evaluation (unless --eval), the pipeline's stages and files (partition, encode and
index outputs, faiss, SQLite: the harness builds their equivalents in memory), results and checkpoint writes.
FedCache runs with `round` consistency (both executors compute the same thing; params.yaml's `step` needs the
vectorized one). The paper-scale cell (K = 300, hetero) runs once more as `fedcache-step`, in params.yaml's `step`:
its per-step exchange steps every group in lockstep, so every group's grouped network is alive for the round,
where `round` trains each group's round alone (heterogeneous: one group a core at a time, train.side_by_side);
the memory check covers both. With --rounds 1 (the default) the timed round is also the process's first, one-time
kernel set-up included; that cost is the same at every K, so it shows as a fixed cost that flatters large K: --rounds 2
times a warm round (twice the rounds). Threads: the executor's own default (every core vectorized, 1
sequential) unless --threads.

Writes the rows as JSON for the docs (--json; default bench/results/scaling-<cpu>.json for the default grid on
FashionMNIST, bench/.work/scaling/ for anything else). Measure on an idle machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # the pipeline, and the sibling bench modules (also as bench.scaling)

from pipeline.machine import cpu_description
from pipeline.train.executors import SequentialExecutor, VectorizedExecutor

KS = (20, 100, 300)
MODELS = {"homo": "ResNet-8 (A1) on every client", "hetero": "A1/A2/A3 = ResNet-8/16/20 by client index"}
METHODS = ("fedcache", "fedavg")
PARAMS_CLASSES = {"fedcache": "FedCacheParams", "fedavg": "FedAvgParams"}  # each in pipeline/methods/<m>/params.py
LINEAR_BAND = 0.25  # s / client-sample at the largest K within +-25% of the smallest's: linear in samples
PAPER_K, PAPER_SAMPLES, MEMORY_LIMIT_GIB = 300, 200, 4.0
STEP = "fedcache-step"  # FedCache in params.yaml's `step` consistency: the paper-scale cell once more
SERVER_WORK = {"fedcache": "each sample's teacher gathered from its R neighbours' logits, the uploads written in",
               "fedavg": "its weighted mean of the uploaded models"}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


# ------------------------------------------------------------------------------------------------ one cell

def one_cell(args) -> dict:
    """One (method, models, K) in this process: set-up, --rounds timed rounds, optionally an evaluation."""
    import torch
    import torch_harness as h
    from executors import build_fedavg, make_executor

    method, models, k = args.one[0], args.one[1], int(args.one[2])
    torch.set_num_threads(args.threads)
    setting = h.scaled_setting(k, models == "hetero", args.samples_per_client)
    start = time.perf_counter()
    if method == "fedavg":
        sim, part = build_fedavg(setting, "cpu", args.group_size, args.synthetic)
    else:
        consistency = "step" if method == STEP else "round"
        sim, part = h.build(setting, consistency, "cpu", args.group_size, args.synthetic)
    setup_s = time.perf_counter() - start
    setup_rss = peak_rss_gib()
    sim.executor = make_executor(args)
    timers: list = []
    seconds = h.timed_rounds(sim, args.rounds, "cpu", timers)
    last = len(seconds)
    trained = sum(sim.samples_trained(c, last) for c in sim.clients)
    eval_s = None
    if args.eval:
        start = time.perf_counter()
        sim.evaluate(last)
        eval_s = time.perf_counter() - start
    groups = sim.executor.groups(sim.clients) if hasattr(sim.executor, "groups") else None
    return {"method": method, "models": models, "K": part.num_clients, "samples": trained,
            "round_s": seconds[-1], "rounds_s": seconds, "server_s": timers[-1].seconds.get("exchange", 0.0),
            "s_per_sample": seconds[-1] / trained, "setup_s": setup_s, "eval_s": eval_s,
            "setup_rss_gib": setup_rss, "peak_rss_gib": peak_rss_gib(), "threads": torch.get_num_threads(),
            "groups": [len(g) for g in groups] if groups is not None else None}


# ------------------------------------------------------------------------------------------------ the grid

def hetero_unsupported(method: str) -> str | None:
    """Why the library's `method` cannot run different architectures on different clients, or None if it can."""
    import importlib

    try:
        module = importlib.import_module(f"pipeline.methods.{method}.params")
    except ImportError:  # a machine without pydantic: the declaration cannot be read
        return "averages model parameters (one architecture)" if method == "fedavg" else None
    condition = getattr(module, PARAMS_CLASSES[method]).supports.heterogeneous
    return None if condition is True else getattr(condition, "why", str(condition))


def plan(ks, models, methods) -> tuple[list[tuple[str, str, int]], list[str]]:
    """The cells to run, (method, models, K), and a line for each (method, models) that cannot run."""
    cells, skipped = [], []
    for method in methods:
        for m in models:
            why = hetero_unsupported(method) if m == "hetero" else None
            if why:
                skipped.append(f"{method} {m}: skipped, the library's {method} {why}, so it cannot run "
                               f"{MODELS[m]}")
                continue
            cells += [(method, m, k) for k in ks]
    if "fedcache" in methods and "hetero" in models and PAPER_K in ks:
        cells.append((STEP, "hetero", PAPER_K))  # the default consistency's memory at paper scale
    return cells, skipped


def run_cell(cell: tuple[str, str, int], args) -> tuple[dict | None, list[str]]:
    """The cell in a fresh process: its row (None if it failed) and the other lines it printed (notes, errors)."""
    method, models, k = cell
    cmd = [sys.executable, str(Path(__file__)), "--one", method, models, str(k),
           "--samples-per-client", str(args.samples_per_client), "--executor", args.executor,
           "--threads", str(args.threads), "--rounds", str(args.rounds), "--group-size", str(args.group_size)]
    cmd += ["--eval"] * args.eval + ["--synthetic"] * args.synthetic
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=False)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = out.stderr.strip().splitlines()[-15:]
        return None, [f"{method} {models} K={k} failed (exit {out.returncode}):", *tail]
    return json.loads(lines[-1]), lines[:-1]


# ------------------------------------------------------------------------------------------------ the trend

def fit(rows: list[dict]) -> tuple[float, float]:
    """Least squares round s = fixed + per_sample x samples over the rows: (fixed, per_sample)."""
    n = len(rows)
    xs, ys = [r["samples"] for r in rows], [r["round_s"] for r in rows]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    per_sample = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else my / mx
    return my - per_sample * mx, per_sample


def mean_group(row: dict) -> float | None:
    return sum(row["groups"]) / len(row["groups"]) if row.get("groups") else None


def reasons(rows: list[dict], falls: bool) -> list[str]:
    """What the figures show about why s / client-sample moved with K (`falls`: it fell), largest K against smallest."""
    first, last = rows[0], rows[-1]
    out = []
    fixed, _ = fit(rows)
    if falls and fixed > 0.1 * first["round_s"]:
        first_round = ", and the process's first-round set-up" if len(first.get("rounds_s", [])) == 1 else ""
        out.append(f"a fixed {fixed:.2f} s per round (the fit's intercept, {fixed / first['round_s']:.0%} of K="
                   f"{first['K']}'s round: per-round work that does not grow with the samples{first_round}) spread "
                   "over more samples")
    g0, g1 = mean_group(first), mean_group(last)
    if g0 and g1 and (g1 > (1 + LINEAR_BAND) * g0 if falls else g1 < g0 / (1 + LINEAR_BAND)):
        out.append(f"{'bigger' if falls else 'smaller'} grouped networks ({g0:.0f} -> {g1:.0f} clients per group on "
                   "average): each grouped step's fixed work (Python, kernel launches) is shared by "
                   f"{'more' if falls else 'fewer'} clients")
    # the seconds by which the largest K's round (and its server part) miss linear scaling from the smallest K's
    round_excess = last["round_s"] - first["s_per_sample"] * last["samples"]
    server_excess = last["server_s"] - first["server_s"] / first["samples"] * last["samples"]
    if server_excess * round_excess > 0 and abs(server_excess) >= 0.1 * abs(round_excess):
        out.append(f"the server half: {abs(server_excess):.2f} s of the {abs(round_excess):.2f} s by which K="
                   f"{last['K']}'s round is {'under' if falls else 'over'} linear ({SERVER_WORK[first['method']]})")
    if not falls and last["peak_rss_gib"] > 2 * first["peak_rss_gib"]:
        out.append(f"a working set of {first['peak_rss_gib']:.1f} -> {last['peak_rss_gib']:.1f} GiB peak RSS "
                   "(more clients' data, models and optimizer state to stream through the CPU caches)")
    return out


def trend(rows: list[dict]) -> str:
    """One (method, models)'s rows: is a round's cost linear in the samples it trains, and if not, which way and why."""
    rows = sorted(rows, key=lambda r: r["K"])
    if len(rows) < 2:
        return "one K only: no trend"
    first, last = rows[0], rows[-1]
    ratio = last["s_per_sample"] / first["s_per_sample"]
    fixed, per_sample = fit(rows)
    head = (f"s / client-sample {first['s_per_sample']:.3g} at K={first['K']} -> {last['s_per_sample']:.3g} at "
            f"K={last['K']} (x{ratio:.2f}); fit: round s = {fixed:.2f} + {per_sample:.3g} x samples")
    if abs(ratio - 1) <= LINEAR_BAND:
        return f"{head}: linear in samples (within +-{LINEAR_BAND:.0%})"
    falls = ratio < 1
    way = ("sublinear, cheaper per sample at larger K" if falls else "superlinear, dearer per sample at larger K")
    why = reasons(rows, falls) or [("no cause visible in these figures (other load on the machine? rerun it idle, "
                                    "with --rounds 2)")]
    return f"{head}: not linear, {way}: " + "; ".join(why)


def paper_check(rows: list[dict], samples_per_client: int) -> str:
    """The K = 300 hetero cells' peak memory against the 4 GiB paper scale must fit in."""
    paper = [r for r in rows if r["K"] == PAPER_K and r["models"] == "hetero"]
    if not paper:
        return f"paper scale (K={PAPER_K}, hetero): not in this run"
    scale = ("" if samples_per_client == PAPER_SAMPLES
             else f" at {samples_per_client} samples per client, not {PAPER_SAMPLES}")
    return "; ".join(f"paper scale (K={PAPER_K}, hetero{scale}) {r['method']} peak RSS {r['peak_rss_gib']:.2f} GiB: "
                     f"{'within' if r['peak_rss_gib'] <= MEMORY_LIMIT_GIB else 'over'} {MEMORY_LIMIT_GIB:.0f} GiB"
                     for r in paper)


# ------------------------------------------------------------------------------------------------ output

def table(rows: list[dict], with_eval: bool) -> str:
    head = ["method", "models", "K", "samples trained", "round s", "server s", "s / client-sample", "peak RSS GiB",
            "set-up s", *(["eval s"] if with_eval else []), "groups (mean clients)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        groups = f"{len(r['groups'])} ({mean_group(r):.1f})" if r.get("groups") else "-"
        cells = [r["method"], r["models"], str(r["K"]), f"{r['samples']:,}", f"{r['round_s']:.2f}",
                 f"{r['server_s']:.2f}", f"{r['s_per_sample']:.3g}", f"{r['peak_rss_gib']:.2f}", f"{r['setup_s']:.1f}",
                 *([f"{r['eval_s']:.2f}"] if with_eval else []), groups]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_json(args, data: str) -> Path:
    """bench/results for the default grid on FashionMNIST (what docs are built from), bench/.work otherwise."""
    from roofline import cpu_slug

    full = (tuple(args.ks) == KS and args.samples_per_client == PAPER_SAMPLES and set(args.models) == set(MODELS)
            and set(args.methods) == set(METHODS) and data == "FashionMNIST")
    return ROOT / "bench" / ("results" if full else ".work/scaling") / f"scaling-{cpu_slug()}.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ks", nargs="+", type=int, default=list(KS), help="numbers of clients K")
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    ap.add_argument("--samples-per-client", type=int, default=PAPER_SAMPLES, help="mean training samples per client")
    ap.add_argument("--executor", choices=["sequential", "vectorized"], default="vectorized")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: the executor's own: every core vectorized, 1 sequential)")
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds per cell (the last is reported)")
    ap.add_argument("--group-size", type=int, default=32, help="the vectorized executor's clients per group")
    ap.add_argument("--eval", action="store_true", help="also time one evaluation after the rounds")
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--json", type=Path, default=None, help="where the rows go (default: see above)")
    ap.add_argument("--one", nargs=3, metavar=("METHOD", "MODELS", "K"), help=argparse.SUPPRESS)  # internal: a cell
    args = ap.parse_args()
    if args.threads is None:  # at batch 8 a second thread slows the sequential executor's one small model down
        args.threads = (VectorizedExecutor if args.executor == "vectorized" else SequentialExecutor).threads
    if args.one:
        print(json.dumps(one_cell(args)))
        return

    header = {"cpu": cpu_description(), "threads": args.threads, "batch": 8, "executor": args.executor,
              "group_size": args.group_size, "rounds": args.rounds, "samples_per_client": args.samples_per_client,
              "date": datetime.date.today().isoformat(),
              "command": shlex.join(["python", "bench/scaling.py", *sys.argv[1:]])}
    print(f"# one round at K = {', '.join(map(str, args.ks))}, {args.samples_per_client} samples per client "
          f"(Dirichlet 1.0); {header['cpu']}; {args.threads} torch threads, batch 8, executor {args.executor}"
          + (f" (groups of up to {args.group_size})" if args.executor == "vectorized" else "")
          + f", {args.rounds} timed round(s), the last reported; {header['date']}", flush=True)
    cells, skipped = plan(args.ks, args.models, args.methods)
    rows, notes, failed = [], [], []
    for cell in cells:
        row, lines = run_cell(cell, args)
        for line in lines:  # e.g. the harness's "FashionMNIST not found", once
            if line not in notes:
                notes.append(line)
                print(line, flush=True)
        if row is None:
            failed.append(" ".join(map(str, cell)))
            continue
        rows.append(row)
        print(f"{row['method']} {row['models']} K={row['K']}: round {row['round_s']:.2f} s, {row['s_per_sample']:.3g} "
              f"s / client-sample, peak RSS {row['peak_rss_gib']:.2f} GiB", flush=True)
    data = "synthetic" if args.synthetic or any("synthetic" in n for n in notes) else "FashionMNIST"

    print(f"\n{data}; samples trained = local epochs (1) x every client's training samples; server s is part of "
          "round s\n")
    print(table(rows, args.eval))
    print()
    trends = {}
    for method in args.methods:
        for m in args.models:
            own = [r for r in rows if r["method"] == method and r["models"] == m]
            if own:
                trends[f"{method} {m}"] = trend(own)
                print(f"- trend, {method} {m}: {trends[f'{method} {m}']}")
    for line in skipped:
        print(f"- {line}")
    check = paper_check(rows, args.samples_per_client)
    print(f"- {check}")

    out = args.json or default_json(args, data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": {**header, "data": data}, "rows": rows, "trends": trends,
                               "skipped": skipped, "check": check, "failed": failed}, indent=1) + "\n")
    print(f"\nwritten to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    if failed:
        sys.exit(f"failed cells: {', '.join(failed)}")


if __name__ == "__main__":
    main()
