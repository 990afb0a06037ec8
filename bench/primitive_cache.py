"""oneDNN's primitive cache side by side (issue 39): training rounds and evaluation at each cache capacity.

    .venv/bin/python bench/primitive_cache.py            # params.yaml's setting, capacities 1024 (oneDNN's default),
                                                          # 2048, 4096; an idle machine
    .venv/bin/python bench/primitive_cache.py --docs     # docs/executors.md's section from the result files

oneDNN (torch's CPU convolutions) builds a "primitive" for every convolution shape and kind it meets, compiling its
kernel when it is created, and keeps the latest ONEDNN_PRIMITIVE_CACHE_CAPACITY of them. A round of the vectorized
executor meets many shapes (grouped networks of each group's active clients, forward and backward; then every
client's own model on its test and validation splits), and at the default capacity the round's primitives push the
evaluation's out and the other way round, so every round compiles its kernels again. pipeline/train/engine.py sets
the capacity the library trains with (unless the environment sets one).

The setting is params.yaml's (K = 20 clients x 100 FashionMNIST samples, ResNet-8, batch 8, FedCache `step`
consistency, vectorized executor, torch threads = every core; bench/torch_harness.py). Each capacity runs in a
process of its own (oneDNN reads the variable once), one after another, --repeats times in turn; each trains
--rounds rounds, each followed by the evaluation of both splits of every client, in each precision `auto` can
choose here. Per process: the median round seconds and evaluation seconds of rounds 2..N (round 1 meets every shape
for the first time) and its peak resident memory; the table shows the median over the repeats. The arithmetic is the
same at every capacity (a cache hit or a new primitive runs the same kernel), so the accuracies must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from docs_section import replace_section, write_or_check  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "executors.md"
BEGIN, END = "<!-- primitive-cache: begin (bench/primitive_cache.py --docs) -->", "<!-- primitive-cache: end -->"
HEADING = "## oneDNN's primitive cache, measured"
CAPACITIES = (1024, 2048, 4096)  # 1024: oneDNN's default


def child(capacity: int, precision: str, rounds: int, threads: int, synthetic: bool) -> dict:
    """One capacity's rounds in this process (the variable set before torch runs its first convolution)."""
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(capacity)
    import torch
    import torch_harness as h

    from pipeline.train.executors import VectorizedExecutor

    torch.set_num_threads(threads)
    sim, _ = h.build("small", "step", "cpu", 32, synthetic, precision=precision)
    sim.executor = VectorizedExecutor(32)
    round_s, eval_s, accs = [], [], []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        sim.run_round(r, list(range(len(sim.clients))))
        round_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        accs = [a for _, a, _ in sim.evaluate(r)[0]]
        sim.evaluate(r, "val")
        eval_s.append(time.perf_counter() - start)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"capacity": capacity, "precision": precision, "round_s": statistics.median(round_s[1:]),
            "eval_s": statistics.median(eval_s[1:]), "peak_mib": peak_kib / 1024, "acc": accs}


def measure(repeats: int, rounds: int, threads: int, synthetic: bool) -> dict:
    from eval_speed import machine_header
    from pipeline.train.precision import resolved_precision

    precisions = ["float32"] + (["bfloat16"] if resolved_precision("auto", "cpu") == "bfloat16" else [])
    runs = []
    for precision in precisions:
        for _ in range(repeats):
            for capacity in CAPACITIES:
                cmd = [sys.executable, str(Path(__file__)), "--child", str(capacity), "--precision", precision,
                       "--rounds", str(rounds), "--threads", str(threads)] + (["--synthetic"] if synthetic else [])
                out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"header": {**machine_header("python bench/primitive_cache.py"), "threads": threads, "rounds": rounds,
                       "repeats": repeats},
            "runs": runs}


def table(result: dict) -> str:
    from eval_speed import machine_line

    head = result["header"]
    lines = [machine_line(head) + "params.yaml's K = 20 x 100, ResNet-8, FedCache `step`, vectorized executor; "
             f"{head['rounds']} rounds a "
             f"process (rounds 2..N), {head['repeats']} processes a capacity; measured {head['date']} with "
             f"`{head['command']}`.", "",
             "| precision | capacity | round s | evaluation s | round + evaluation: speed-up | peak MiB | same acc |",
             "|---|---|---|---|---|---|---|"]
    for precision in dict.fromkeys(r["precision"] for r in result["runs"]):
        runs = [r for r in result["runs"] if r["precision"] == precision]
        by_cap = {c: [r for r in runs if r["capacity"] == c] for c in dict.fromkeys(r["capacity"] for r in runs)}
        med = {c: {k: statistics.median(r[k] for r in rs) for k in ("round_s", "eval_s", "peak_mib")}
               for c, rs in by_cap.items()}
        base = med[min(med)]
        reference = by_cap[min(by_cap)][0]["acc"]
        for c, m in med.items():
            speed_up = (base["round_s"] + base["eval_s"]) / (m["round_s"] + m["eval_s"])
            same = all(r["acc"] == reference for r in by_cap[c])
            lines.append(f"| {precision} | {c}{' (default)' if c == 1024 else ''} | {m['round_s']:.2f} | "
                         f"{m['eval_s']:.2f} | {speed_up:.2f}x | {m['peak_mib']:.0f} | {'yes' if same else 'no'} |")
    return "\n".join(lines)


def render_docs(results: list[dict], text: str) -> str:
    from eval_speed import section_heading

    body = "\n\n".join(f"{section_heading(r)}\n\n{table(r)}" for r in results)
    intro = ("Generated by `.venv/bin/python bench/primitive_cache.py --docs` from "
             "bench/results/primitive-cache-*.json (each written by `.venv/bin/python bench/primitive_cache.py` on "
             "the CPU it names).")
    return replace_section(text, BEGIN, END, f"{BEGIN}\n{intro}\n\n{body or 'Not measured yet.'}\n{END}", HEADING)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=2, help="processes per capacity and precision")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--docs", action="store_true", help="render bench/results/primitive-cache-*.json into the docs")
    ap.add_argument("--check", action="store_true", help="with --docs: exit 1 when docs/executors.md is stale")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)  # internal: one capacity in this process
    ap.add_argument("--precision", default="float32", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.docs:
        results = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("primitive-cache-*.json"))]
        return write_or_check(DOCS, DOCS.read_text(), render_docs(results, DOCS.read_text()), args.check,
                              "bench/primitive_cache.py --docs")
    if args.child:
        print(json.dumps(child(args.child, args.precision, args.rounds, args.threads, args.synthetic)))
        return 0
    result = measure(args.repeats, args.rounds, args.threads, args.synthetic)
    print(table(result))
    from eval_speed import result_path, save_result

    save_result(result, args.json or result_path("primitive-cache"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
