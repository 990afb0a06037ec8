"""Speed levers side by side on the default setting (issue 39): what each one gives, and what it costs in accuracy.

    .venv/bin/python bench/levers.py                               # every lever, 3 rounds each (an idle machine)
    .venv/bin/python bench/levers.py --levers compile eval --rounds 4
    .venv/bin/python bench/levers.py --docs                        # docs/executors.md's lever section from the files

The setting is params.yaml's: K = 20 clients x 100 FashionMNIST samples, ResNet-8, batch 8, FedCache with `step`
consistency on the vectorized executor (group size 32: all 20 clients in one grouped network), evaluation batch 512,
torch threads = every core. It runs through bench/torch_harness.py (the library's own Simulation, FedCache,
executors and clients; a random-projection hash instead of HOG, no SQL store).

The baseline and every lever setting run in a process of their own, on the same partition, seed and initial
weights. Each runs --rounds rounds; after each round every client is evaluated on its test and validation splits,
as the training stage does. Round seconds (training: downloads, local steps with the per-step exchange, uploads,
aggregation) and evaluation seconds are timed apart; round 1 is shown on its own (first-call warm-up, and
torch.compile's compiling), the best and the mean of rounds 2..N beside it. The accuracy is the mean client accuracy
on the test splits after the last round, and its difference from the baseline's is paired by client with a 95%
bootstrap interval (pipeline.results.intervals). A lever that does the same arithmetic (channels_last, group size,
evaluation mode and batch, the kl_div loss) can move the accuracy only through float32 summation order: in
float32, BatchNorm over small batches amplifies last-bit differences within a few steps (docs/executors.md,
Equivalence), so a small nonzero difference there is reordering, not an effect.

The levers, each applied from this script, none of them by editing the library:

  channels_last  the grouped network's memory layout. The library trains in NHWC and evaluates in NCHW
                 (pipeline/train/executors.py, TRAIN_CHANNELS_LAST, since bffdbe6); the rows: NCHW training (the
                 default before), and NHWC evaluation too. Files measured before bffdbe6 hold one row instead,
                 NHWC throughout against an NCHW baseline (with a copy of the input into NHWC storage that the
                 library lacked then: its switch did nothing for one-channel images). The stacked conv weights
                 stay NCHW (oneDNN takes NHWC activations with them): the per-client views (`client_view`,
                 GroupedSGD) need contiguous stacks, so NHWC weights would need those views rewritten.
  group_size     8 and 16 (the baseline's 32 holds all 20 clients in one group).
  compile        torch.compile (inductor, default mode) of GroupedModel.forward: the grouped forward and, through
                 AOTAutograd, its backward. The loss and the per-step exchange stay eager (the exchange is a Python
                 call into the server half). Compile seconds are dynamo's own total; a new step shape (fewer
                 active clients, a partial batch, evaluation) compiles again, up to dynamo's recompile limit.
  eval           evaluation under no_grad instead of inference_mode; evaluation batch 256 and 2048 instead of 512;
                 batched across clients in grouped networks (bench/eval_speed.py's, the vectorized executor's until
                 one client at a time measured faster) instead of one client at a time. Files measured before that
                 change hold the other way round: a batched baseline and a one-client-at-a-time row.
  loss           FedCache's distillation term as one F.kl_div(log_target=True) call, or torch.compile'd (its
                 softmaxes, exp and sum fused into one kernel).
  precision      train.precision: bfloat16 autocast against float32, when the knob exists in pipeline/config.py.
  startup        each stage's start-up parts, each in fresh processes (median of 3): the interpreter, `import
                 torch`, `import torch._dynamo`, `import prefect`, `import flows.train` (the training stage's
                 imports), the first torch.optim.SGD (torch's Optimizer imports torch._dynamo when the first one
                 is built, so every training process pays that import) and loading FashionMNIST.

Prints a Markdown table and writes the rows as JSON (--json; default bench/results/levers-<cpu>.json, or
bench/.work/levers/ for a non-default scale). `--docs` renders every bench/results/levers-*.json into
docs/executors.md between its two `levers` markers, so the figures there are never typed by hand.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # the pipeline, and the sibling bench modules (also as bench.levers)

from docs_section import replace_section
from pipeline.machine import cpu_description

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "executors.md"
BEGIN, END = "<!-- levers: begin (bench/levers.py --docs) -->", "<!-- levers: end -->"
DOCS_HEADING = "## Speed levers, measured"

DEFAULT_SCALE = {"clients": 20, "samples": 100}  # params.yaml's partition
LEVERS = ("channels_last", "group_size", "compile", "eval", "loss", "precision", "startup")


# ------------------------------------------------------------------------------------------------ the variants

@dataclass(frozen=True)
class Variant:
    """One run's knobs; the defaults are the baseline (params.yaml's choices)."""

    lever: str = "baseline"
    setting: str = ("params.yaml: group 32, NHWC training and NCHW evaluation, eager, eval batch 512 one client "
                    "at a time under inference_mode, float32")
    group_size: int = 32
    layout: str = "library"  # library (NHWC training, NCHW evaluation) | nchw (throughout) | nhwc (throughout)
    compile: bool = False
    eval_grad: str = "inference_mode"  # inference_mode (the library's) | no_grad
    eval_batch: int = 512
    eval_batched: bool = False  # batched across clients in grouped networks instead of one client at a time
    loss: str = "library"  # library | kl_div | compiled
    precision: str = "float32"


BASELINE = Variant()
VARIANTS: dict[str, list[Variant]] = {
    "channels_last": [replace(BASELINE, lever="channels_last", setting="NCHW training (the default before bffdbe6)",
                              layout="nchw"),
                      replace(BASELINE, lever="channels_last", setting="NHWC evaluation too", layout="nhwc")],
    "group_size": [replace(BASELINE, lever="group_size", setting=f"{g} (groups of {g})", group_size=g)
                   for g in (8, 16)],
    "compile": [replace(BASELINE, lever="compile", setting="inductor, GroupedModel.forward", compile=True)],
    "eval": [replace(BASELINE, lever="eval", setting="no_grad", eval_grad="no_grad"),
             replace(BASELINE, lever="eval", setting="batch 256", eval_batch=256),
             replace(BASELINE, lever="eval", setting="batch 2048", eval_batch=2048),
             replace(BASELINE, lever="eval", setting="batched across clients (the default before)", eval_batched=True)],
    "loss": [replace(BASELINE, lever="loss", setting="KD as one F.kl_div", loss="kl_div"),
             replace(BASELINE, lever="loss", setting="KD torch.compile'd", loss="compiled")],
    "precision": [replace(BASELINE, lever="precision", setting="bfloat16 autocast", precision="bfloat16")],
}


def precision_knob() -> bool:
    """Whether pipeline/config.py's train section has the `precision` knob (float32 | bfloat16 autocast)."""
    from pipeline.config import TrainParams

    return "precision" in TrainParams.model_fields


def bf16_flags() -> dict[str, bool]:
    """The CPU's bf16 instruction flags (/proc/cpuinfo): without them bf16 arithmetic is emulated."""
    from pipeline.machine import BF16_UNITS, bf16_units

    found = bf16_units()
    return {name: name in found for name in BF16_UNITS}


# ------------------------------------------------------------------------------------------------ one run

def apply_levers(v: Variant) -> None:
    """Patch this process's library objects for the variant (each child process runs one variant)."""
    import torch

    import pipeline.methods.fedcache.method as fedcache
    from models import grouped
    from pipeline.train import executors

    if v.layout == "nchw":
        executors.TRAIN_CHANNELS_LAST = False  # read by each round's grouped training
    elif v.layout == "nhwc":
        build = grouped.GroupedModel.__init__

        def channels_last_init(self, models, channels_last=True):  # evaluation's grouped networks too
            build(self, models, channels_last)

        grouped.GroupedModel.__init__ = channels_last_init
    if v.compile:
        grouped.GroupedModel.forward = torch.compile(grouped.GroupedModel.forward)
    if v.eval_grad == "no_grad":
        # the same function without its @torch.inference_mode(), under no_grad instead (LocalUpdate.evaluate's)
        from pipeline.federation import clients, contract

        contract.evaluate_model = torch.no_grad()(clients.evaluate_model.__wrapped__)
    if v.loss == "kl_div":
        fedcache.kd_rows = kd_rows_kl_div
    elif v.loss == "compiled":
        fedcache.kd_rows = torch.compile(fedcache.kd_rows, dynamic=True)


def kd_rows_kl_div(student, teacher_logits, T: float):
    """pipeline.federation.losses.kd_rows with its KL as one F.kl_div(log_target=True) call (the same sum)."""
    import torch.nn.functional as F

    from pipeline.federation.losses import teacher_weight

    teacher, weight = teacher_weight(teacher_logits)
    kl = F.kl_div(F.log_softmax(student / T, dim=1), F.log_softmax(teacher / T, dim=1), reduction="none",
                  log_target=True).sum(dim=1)
    return kl * weight * (T * T)


class RecompileLimit(logging.Handler):
    """Counts dynamo's "hit config.recompile_limit" warnings: past the limit, a function runs eager."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.hits = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.hits += "recompile_limit" in record.getMessage()


def watch_recompile_limit() -> RecompileLimit:
    handler = RecompileLimit()
    logging.getLogger("torch._dynamo.convert_frame").addHandler(handler)
    return handler


def compile_stats(limit: RecompileLimit) -> dict:
    """Dynamo's compile seconds so far in this process (tracing and inductor, forward and backward graphs), the
    graphs it compiled, and how often a function hit the recompile limit."""
    from torch._dynamo.utils import calculate_time_spent, counters

    spent = calculate_time_spent()
    seconds = spent.get("total_wall_time", spent.get("entire_frame_compile", 0.0)
                        + spent.get("entire_backward_compile", 0.0))
    return {"compile_s": seconds, "graphs": counters["stats"]["unique_graphs"], "recompile_limit_hit": limit.hits}


def one_run(v: Variant, rounds: int, scale: dict, synthetic: bool, eval_rows: int | None, threads: int) -> dict:
    """The variant's rounds in this process: per round, training seconds and evaluation seconds."""
    import torch
    import torch_harness as h

    from pipeline.train.executors import VectorizedExecutor

    torch.set_num_threads(threads)
    limit = watch_recompile_limit()
    apply_levers(v)
    params = h.bench_params("resnet8", "step", v.group_size)  # FedCache's default consistency
    params.train.eval_batch_size = v.eval_batch
    params.train.precision = v.precision  # unused where the library has no such knob (measure() runs no bf16 then)
    setting = h.scaled_setting(scale["clients"], False, scale["samples"])
    sim, part = h.simulation(h.HarnessFedCache, setting, params, "cpu", synthetic)
    sim.executor = VectorizedExecutor(v.group_size)
    if v.eval_batched:
        from eval_speed import evaluator

        sim.executor.evaluate = evaluator("batched across clients")
    if eval_rows is not None:  # smoke runs: the first rows of each client's test and validation splits
        for c in sim.clients:
            c.x_test, c.y_test = c.x_test[:eval_rows], c.y_test[:eval_rows]
            c.x_val, c.y_val = c.x_val[:eval_rows], c.y_val[:eval_rows]
    selected = list(range(len(sim.clients)))
    round_s, eval_s, rows = [], [], []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        sim.run_round(r, selected)
        round_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        rows, _ = sim.evaluate(r)
        sim.evaluate(r, "val")
        eval_s.append(time.perf_counter() - start)
    out = {**asdict(v), "round_s": round_s, "eval_s": eval_s, "threads": torch.get_num_threads(),
           "clients": part.num_clients, "samples": part.num_train,
           "acc": [a for _, a, _ in rows], "n": [n for _, _, n in rows]}
    if v.compile or v.loss == "compiled":
        out.update(compile_stats(limit))
    return out


# ------------------------------------------------------------------------------------------------ start-up

STARTUP = (  # (what, set-up not timed, the timed statement), each in a fresh interpreter
    ("the interpreter (python -c pass)", "", "pass"),
    ("import torch", "", "import torch"),
    ("import torch._dynamo (after torch)", "import torch", "import torch._dynamo"),
    ("import prefect (with flows' settings)", "import flows", "import prefect"),
    ("import flows.train (the training stage's imports)", "", "import flows.train"),
    ("the same, the collector paused as python -m flows.<stage> has it (flows/__init__.py)", "import gc\ngc.disable()",
     "import flows.train"),
    ("the first torch.optim.SGD (after torch)", "import torch",
     "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)"),
    ("load FashionMNIST (data/raw)", "from pathlib import Path\nfrom pipeline.data.datasets import load_dataset",
     "load_dataset('fashion_mnist', Path('data/raw'))"),
)
# the end of a stage: the interpreter's shutdown after the training stage's imports and first optimizer, as it was
# and with the heap frozen first (gc.freeze(), what flows/cli.py's run_stage does): its full collections skip it
STAGE_HEAP = "import flows.train\nimport torch\ntorch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)"
EXITS = (("the exit after the training stage's imports", ""),
         ("the same exit, the heap frozen first (gc.freeze(), flows/cli.py)", "import gc\ngc.freeze()"))


def startup_once(setup: str, statement: str) -> dict:
    """One fresh interpreter: the statement's seconds (the interpreter's own start for `pass`, whole-process wall
    time), and whether torch._dynamo was imported by then."""
    code = "\n".join(["import sys, time", f"sys.path.insert(0, {str(ROOT)!r})", setup, "t = time.perf_counter()",
                      statement, "s = time.perf_counter() - t",
                      "print(s, 'torch._dynamo' in sys.modules)"])
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    seconds, dynamo = out.stdout.split()[-2:]
    return {"s": wall if statement == "pass" else float(seconds), "dynamo": dynamo == "True"}


def exit_once(before_exit: str) -> dict:
    """One fresh interpreter with the training stage's heap (STAGE_HEAP): seconds from its last statement to the
    end of the process (wall clock, both sides)."""
    code = "\n".join(["import sys, time", f"sys.path.insert(0, {str(ROOT)!r})", STAGE_HEAP, before_exit,
                      "print(time.time(), 'torch._dynamo' in sys.modules, flush=True)"])
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True)
    ended = time.time()
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    last, dynamo = out.stdout.split()[-2:]
    return {"s": ended - float(last), "dynamo": dynamo == "True"}


def server_once() -> dict:
    """One stage Prefect server (flows/api.py, as a stage starts it, owned by this process): seconds from its start to
    its first answer, then stopped."""
    from flows import api

    port = api._free_port()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "flows.api", "--owner", str(os.getpid()), "--port", str(port)],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not api._healthy(f"http://127.0.0.1:{port}/api"):
            if proc.poll() is not None:
                return {"error": (proc.stderr.read().strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
            if time.perf_counter() - start > 180:
                return {"error": "the server did not answer within 180 s"}
            time.sleep(0.05)  # poll interval of the health check
        return {"s": time.perf_counter() - start, "dynamo": False}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def startup(repeats: int = 3) -> list[dict]:
    rows = []
    parts = [(what, lambda setup=setup, statement=statement: startup_once(setup, statement))
             for what, setup, statement in STARTUP]
    parts.append(("a stage's Prefect server, from its start to its first answer (python -m flows.api)", server_once))
    parts += [(what, lambda before=before: exit_once(before)) for what, before in EXITS]
    for what, once in parts:
        runs = [once() for _ in range(repeats)]
        errors = [r["error"] for r in runs if "error" in r]
        row = {"what": what, "seconds": [r["s"] for r in runs if "s" in r],
               "dynamo": any(r.get("dynamo") for r in runs)}
        if errors:
            row["error"] = errors[0]
        rows.append(row)
        print(f"startup: {what}: " + (row.get("error") or f"{statistics.median(row['seconds']):.2f} s"), flush=True)
    return rows


# ------------------------------------------------------------------------------------------------ the tables

def steady(seconds: list[float]) -> list[float]:
    """Rounds 2..N (round 1 alone when there is no other)."""
    return seconds[1:] or seconds


def accuracy_cells(row: dict, base: dict) -> tuple[str, str]:
    """(mean accuracy, its difference from the baseline's in points with the 95% paired interval)."""
    import numpy as np

    from pipeline.results.intervals import Accuracies, paired_difference, percent

    mean = f"{float(np.mean(row['acc'])):.2%}"
    if row is base:
        return mean, "-"
    if row["n"] != base["n"]:
        return mean, "not paired (other test splits)"
    a, b = (Accuracies(np.array(r["acc"], dtype=np.float64)[:, None], np.array(r["n"])) for r in (row, base))
    return mean, percent(paired_difference([a], [b], "final_acc"), signed=True)


def notes(row: dict, header: dict) -> str:
    parts = []
    if "graphs" in row:
        parts.append(f"{row['graphs']} graphs compiled"
                     + (f", recompile limit hit {row['recompile_limit_hit']}x (eager after it)"
                        if row.get("recompile_limit_hit") else ""))
    if row["precision"] == "bfloat16" and not any(header["bf16_flags"].values()):
        parts.append("no avx512_bf16/amx_bf16: bf16 is emulated")
    return "; ".join(parts)


def header_lines(header: dict) -> list[str]:
    flags = ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in header["bf16_flags"].items())
    return [(f"{header['cpu']} ({flags}); torch {header['torch']}, {header['threads']} torch threads; "
             f"{header['setting']}; batch {header['batch']}; {header['rounds']} rounds per run; measured "
             f"{header['date']} with `{header['command']}`.")]


def table(result: dict) -> str:
    """The levers' Markdown table (and the start-up table when measured) from a result dict."""
    header, rows = result["header"], result["rows"]
    lines = []
    if rows:
        base = next(r for r in rows if r["lever"] == "baseline")
        base_round, base_eval = statistics.mean(steady(base["round_s"])), statistics.mean(steady(base["eval_s"]))
        lines += [("| lever | setting | round 1 s | round s (best / mean, rounds 2..N) | eval s (best / mean) "
                   "| compile s | speed-up: round / eval | mean acc | acc diff vs baseline (points, 95%) | notes |"),
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            rs, es = steady(r["round_s"]), steady(r["eval_s"])
            compiled = f"{r['compile_s']:.1f}" if "compile_s" in r else ""
            acc, diff = accuracy_cells(r, base)
            lines.append(f"| {r['lever']} | {r['setting']} | {r['round_s'][0]:.2f} | {min(rs):.2f} / "
                         f"{statistics.mean(rs):.2f} | {min(es):.2f} / {statistics.mean(es):.2f} | {compiled} | "
                         f"{base_round / statistics.mean(rs):.2f}x / {base_eval / statistics.mean(es):.2f}x | "
                         f"{acc} | {diff} | {notes(r, header)} |")
    for note in result.get("absent", []):
        lines.append(f"| {note['lever']} | {note['why']} | | | | | | | | |")
    if result.get("startup"):
        lines += [""] if lines else []
        if result.get("startup_measured"):  # measured apart from the levers above
            lines += [f"Start-up parts measured {result['startup_measured']}.", ""]
        lines += ["| start-up part (fresh process) | s (median of runs) | runs | torch._dynamo imported |",
                  "|---|---|---|---|"]
        for s in result["startup"]:
            cell = s.get("error") or f"{statistics.median(s['seconds']):.2f}"
            lines.append(f"| {s['what']} | {cell} | {len(s['seconds'])} | {'yes' if s['dynamo'] else 'no'} |")
    return "\n".join(lines)


WHAT_EACH_DOES = {  # for the docs section: what a lever changes (this module's docstring has the details)
    "channels_last": ("the grouped network's memory layout; the library trains in NHWC and evaluates in NCHW since "
                      "bffdbe6, and the rows measured after it run NCHW training (the default before) or NHWC "
                      "evaluation too; files measured before it hold one row, NHWC throughout against an NCHW "
                      "baseline (the input copied into NHWC storage, which the library's switch did not do then for "
                      "one-channel images); the stacked conv weights stay NCHW, since the per-client views of the "
                      "stacks need them contiguous"),
    "group_size": "8 or 16 clients per grouped network instead of 32 (all 20 in one)",
    "compile": ("torch.compile (inductor) of the grouped forward and its backward; the loss and the per-step exchange "
                "stay eager; compile s is dynamo's total, and each new step shape compiles again"),
    "eval": ("evaluation under no_grad instead of inference_mode, batch 256 or 2048 instead of 512, or batched across "
             "clients instead of one client at a time (a file measured before evaluation went one client at a time, as "
             "both tables below are, has the batched way as its baseline and today's way, under no_grad, as its "
             "row \"one client at a time (no_grad)\"); the training is the baseline's, so its round speed-up shows "
             "the run-to-run noise"),
    "loss": "FedCache's distillation term as one F.kl_div call, or torch.compile'd into one kernel",
    "precision": "train.precision: bfloat16 autocast against float32",
    "startup": ("each part of a stage's start, in fresh processes; torch's first optimizer imports torch._dynamo, so "
                "every training process pays that import; one Prefect server serves every stage of a `dvc repro` "
                "(flows/api.py), and bench/make_run.py measures its start"),
}


def docs_section(results: list[dict]) -> str:
    """The docs' lever section: what each lever does, then every result file's header and table, one CPU kind
    after another."""
    intro = ("Generated by `.venv/bin/python bench/levers.py --docs` from bench/results/levers-*.json, which "
             "`.venv/bin/python bench/levers.py` writes (run it on an idle machine). Each lever runs in a process of "
             "its own against the baseline (params.yaml's defaults, in float32: the `precision` row is what `auto` "
             "adds on a CPU with AMX), on the same partition, seed and initial weights:")
    reading = ("Speed-up: the baseline's mean seconds of rounds 2..N over the lever's, for training and for "
               "evaluation (test and validation splits); round 1 (warm-up, compiling) is its own column. Accuracy: "
               "the mean client accuracy on the test splits after the last round; its difference from the "
               "baseline's is paired by client, with a 95% bootstrap interval. A lever that does the same arithmetic "
               "can differ only by float32 summation order.")
    parts = [BEGIN, intro, "", *[f"- `{lever}`: {what}." for lever, what in WHAT_EACH_DOES.items()], "", reading]
    if not results:
        parts += ["", "Not measured yet."]
    for result in results:
        parts += ["", f"### {result['header']['cpu']}", "", *header_lines(result["header"]), "", table(result)]
    parts.append(END)
    return "\n".join(parts)


def render_docs(results: list[dict], text: str) -> str:
    """`text` (docs/executors.md) with its lever section replaced, or appended under its heading when it has none."""
    return replace_section(text, BEGIN, END, docs_section(results), DOCS_HEADING)


def write_docs(results_dir: Path = RESULTS, docs: Path = DOCS) -> None:
    results = [json.loads(p.read_text()) for p in sorted(results_dir.glob("levers-*.json"))]
    docs.write_text(render_docs(results, docs.read_text()))
    print(f"wrote {docs.relative_to(ROOT) if docs.is_relative_to(ROOT) else docs} from {len(results)} result file(s)")


# ------------------------------------------------------------------------------------------------ the driver

def run_child(v: Variant, args) -> dict:
    cmd = [sys.executable, str(Path(__file__)), "--child", json.dumps(asdict(v)), "--rounds", str(args.rounds),
           "--threads", str(args.threads), "--clients", str(args.clients), "--samples", str(args.samples)]
    cmd += ["--synthetic"] if args.synthetic else []
    cmd += ["--eval-rows", str(args.eval_rows)] if args.eval_rows else []
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if out.returncode != 0:
        return {**asdict(v), "error": (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    levers = [lever for lever in LEVERS if lever in args.levers and lever != "startup"]  # in the table's order
    absent, variants = [], [BASELINE] if levers else []
    for lever in levers:
        if lever == "precision" and not precision_knob():
            absent.append({"lever": "precision", "why": "knob not present (train.precision is not in "
                                                        "pipeline/config.py)"})
            continue
        variants += VARIANTS[lever]
    rows = []
    for v in variants:
        row = run_child(v, args)
        if "error" in row:
            absent.append({"lever": v.lever, "why": f"{v.setting}: failed: {row['error']}"})
            print(f"{v.lever} {v.setting}: failed: {row['error']}", flush=True)
            continue
        rows.append(row)
        print(f"{v.lever} {v.setting}: rounds {', '.join(f'{s:.2f}' for s in row['round_s'])} s, evaluations "
              f"{', '.join(f'{s:.2f}' for s in row['eval_s'])} s", flush=True)
    if rows and rows[0]["lever"] != "baseline":
        raise SystemExit("the baseline run failed: nothing to compare with")
    from importlib.metadata import version

    scale = "params.yaml's" if (args.clients, args.samples) == tuple(DEFAULT_SCALE.values()) else "smoke"
    header = {"cpu": cpu_description(), "bf16_flags": bf16_flags(), "torch": version("torch"),
              "threads": args.threads, "batch": 8, "rounds": args.rounds, "date": datetime.date.today().isoformat(),
              "setting": f"{scale} K = {args.clients} x {args.samples} "
                         f"{'synthetic' if args.synthetic else 'FashionMNIST'} samples, ResNet-8, FedCache `step` "
                         "consistency, vectorized executor"
                         + (f", evaluation on each client's first {args.eval_rows} rows" if args.eval_rows else ""),
              "command": shlex.join(["python", "bench/levers.py", *args.argv])}
    return {"header": header, "rows": rows, "absent": absent,
            "startup": startup(args.startup_repeats) if "startup" in args.levers else []}


def default_json(args) -> Path:
    from roofline import cpu_slug

    official = ((args.clients, args.samples) == tuple(DEFAULT_SCALE.values()) and not args.synthetic
                and not args.eval_rows)
    return (RESULTS if official else ROOT / "bench" / ".work" / "levers") / f"levers-{cpu_slug()}.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levers", nargs="+", choices=LEVERS, default=list(LEVERS))
    ap.add_argument("--rounds", type=int, default=3, help="rounds per run (round 1 is reported on its own)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads (default: every core, the vectorized executor's own)")
    ap.add_argument("--clients", type=int, default=DEFAULT_SCALE["clients"])
    ap.add_argument("--samples", type=int, default=DEFAULT_SCALE["samples"], help="mean training samples per client")
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--eval-rows", type=int, default=None,
                    help="smoke runs: evaluate each client on the first rows of its splits only")
    ap.add_argument("--startup-repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None,
                    help="result file (default bench/results/levers-<cpu>.json; bench/.work/levers/ off the default)")
    ap.add_argument("--docs", action="store_true", help="render bench/results/levers-*.json into docs/executors.md")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: one variant in this process
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # the command the result file names
    if args.docs:
        write_docs()
        return 0
    if args.child:
        print(json.dumps(one_run(Variant(**json.loads(args.child)), args.rounds,
                                 {"clients": args.clients, "samples": args.samples}, args.synthetic, args.eval_rows,
                                 args.threads)))
        return 0
    result = measure(args)
    path = args.json or default_json(args)
    if args.levers == ["startup"] and path.is_file():  # the start-up table alone: the kept levers' rows stay
        kept = json.loads(path.read_text())
        result = {**kept, "startup": result["startup"],
                  "startup_measured": f"{result['header']['date']} with `{result['header']['command']}`"}
    print("\n" + "\n".join(header_lines(result["header"])) + "\n\n" + table(result))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwritten to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
