"""Evaluation side by side (issue 39): how the clients' models are evaluated on their test and validation splits.

    .venv/bin/python bench/eval_speed.py                 # params.yaml's setting, 5 interleaved repeats (idle machine)
    .venv/bin/python bench/eval_speed.py --docs          # docs/executors.md's section from bench/results/eval-*.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python bench/eval_speed.py
                                                         # a CPU with AVX-512 held to the AVX2 kernels

The setting is params.yaml's: K = 20 clients x 100 FashionMNIST samples (their test splits: the whole test set, their
validation splits: as many as their training samples), ResNet-8, evaluation batch 512, torch threads = every core.
FedCache trains on the vectorized executor (bench/torch_harness.py), and as in a training stage every evaluation
follows a training round: at oneDNN's default primitive cache the first evaluation after a round cost more than a
second one (1.55 s, then 1.17 s, in a stage's setting: its kernels compiled again; pipeline/train/engine.py now keeps
them), so evaluating the same weights again and again would measure something a stage does not do. Each repeat trains
a round before each way's evaluation of both splits of every client; the ways take turns first (so a machine that
drifts drifts for all of them alike), --repeats times, in each precision `auto` can choose here:

  one client at a time       the library's (pipeline/train/executors.py `evaluate`, every executor): each client's
                             own model on its own split, under inference_mode (pipeline/federation/clients.py)
  ... under no_grad          the same, under no_grad instead
  batched across clients     the vectorized executor's evaluation until this script measured it (kept here, the
                             library no longer has it): same-architecture clients in one grouped network
                             (models/grouped.py), each step taking the next rows of every client's split, about
                             `eval_batch_size` rows in all, under inference_mode

Seconds (evaluation only, not the rounds) are the median and the best of the repeats; the speed-up is the batched
way's median over each way's. Every way must give every client the accuracy the library gives it (the same model on
the same rows; a way whose summation order flips an argmax would show here): after the timed repeats each way
evaluates the last round's weights once more, untimed, and the table says whether they agree. The result file names
the CPU and the kernels torch ran (ATen's CPU capability, and oneDNN's cap when ONEDNN_MAX_CPU_ISA sets one, e.g. the
AVX2 kernels on a CPU that has AVX-512, as a stand-in for an AVX2-only CPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

import torch  # noqa: E402

from docs_section import replace_section, write_or_check  # noqa: E402
from pipeline.federation.contract import Evaluation  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "executors.md"
BEGIN, END = "<!-- eval: begin (bench/eval_speed.py --docs) -->", "<!-- eval: end -->"
HEADING = "## Evaluation, measured"
WAYS = ("one client at a time", "one client at a time, no_grad", "batched across clients")


@torch.inference_mode()
def batched_accuracy(clients: list, batch_size: int) -> dict[int, Evaluation]:
    """Each client's own model on its own test split, same-architecture `clients` batched in one grouped network:
    each step takes the next rows of every client's split (about `batch_size` rows in all); eval mode, so BatchNorm
    reads running statistics and the zero rows padding a shorter split change nothing."""
    from models.grouped import GroupedModel

    clients = sorted(clients, key=lambda c: -len(c.y_test))  # the clients with rows left are a prefix
    model = GroupedModel([c.model for c in clients])
    model.eval()
    per_client = max(1, batch_size // len(clients))
    correct = [0] * len(clients)
    for start in range(0, len(clients[0].y_test), per_client):
        active = [c for c in clients if len(c.y_test) > start]
        rows = [c.x_test[start:start + per_client] for c in active]
        B = max(len(r) for r in rows)
        x = torch.cat([torch.cat([r, r.new_zeros(B - len(r), *r.shape[1:])]) for r in rows])
        model.set_step(len(active), B, None)
        pred = model(x).argmax(dim=1).view(len(active), B)
        for a, c in enumerate(active):
            y = c.y_test[start:start + per_client]
            correct[a] += int((pred[a, :len(y)] == y).sum())
    return {c.id: Evaluation(len(c.y_test), {"acc": correct[i] / len(c.y_test) if len(c.y_test) else float("nan")})
            for i, c in enumerate(clients)}


def evaluator(way: str):
    """An executor's `evaluate(local, clients, download)` for the way."""
    from pipeline.federation import clients as client_module
    from pipeline.federation import contract
    from pipeline.train.executors import VectorizedExecutor, evaluate
    from pipeline.train.precision import autocast_for

    if way == "one client at a time":
        return evaluate
    if way == "one client at a time, no_grad":
        plain = torch.no_grad()(client_module.evaluate_model.__wrapped__)

        def under_no_grad(local, clients, download):
            contract.evaluate_model, before = plain, contract.evaluate_model  # what LocalUpdate.evaluate calls
            try:
                return evaluate(local, clients, download)
            finally:
                contract.evaluate_model = before
        return under_no_grad

    def batched(local, clients, download):
        with autocast_for(local.params, clients[0].x_test.device):
            return {k: v for group in VectorizedExecutor(len(clients)).groups(clients)
                    for k, v in batched_accuracy(group, local.params.train.eval_batch_size).items()}
    return batched


def kernels() -> str:
    """The kernels torch runs here: ATen's CPU capability, and oneDNN's cap where the environment sets one."""
    from pipeline.machine import ONEDNN_ISA_VARS

    cap = next((f"{v}={os.environ[v]}" for v in ONEDNN_ISA_VARS if os.environ.get(v)), None)
    return torch.backends.cpu.get_cpu_capability() + (f", {cap}" if cap else "")


def machine_header(command: str) -> dict:
    """What a result file says about where and when it was measured (this bench's and bench/primitive_cache.py's)."""
    from pipeline.machine import cpu_description

    return {"cpu": cpu_description(), "kernels": kernels(), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "command": command}


def machine_line(head: dict) -> str:
    """The start of a table's first line: the machine, the kernels, torch and its threads."""
    return f"{head['cpu']}; kernels: {head['kernels']}; torch {head['torch']}, {head['threads']} torch threads; "


def section_heading(result: dict) -> str:
    return f"### {result['header']['cpu']} ({result['header']['kernels']} kernels)"


def result_path(prefix: str) -> Path:
    """bench/results/<prefix>-<cpu>-<kernels>.json: one file per CPU and kernel set."""
    from roofline import cpu_slug

    return RESULTS / f"{prefix}-{cpu_slug()}-{kernels().split(',')[0].lower()}.json"


def save_result(result: dict, path: Path) -> None:
    """A bench's result file (the docs render from it), and where it went."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


def measure(repeats: int, threads: int, synthetic: bool) -> dict:
    import torch_harness as h

    from pipeline.train.executors import VectorizedExecutor
    from pipeline.train.precision import resolved_precision

    torch.set_num_threads(threads)
    sim, part = h.build("small", "step", "cpu", 32, synthetic)
    sim.executor = VectorizedExecutor(32)
    everyone = list(range(len(sim.clients)))
    precisions = ["float32"] + (["bfloat16"] if resolved_precision("auto", "cpu") == "bfloat16" else [])
    rows, round_ = [], 0
    for precision in precisions:
        sim.local.params.train.precision = precision
        seconds: dict[str, list[float]] = {w: [] for w in WAYS}
        for repeat in range(repeats):
            for way in WAYS[repeat % len(WAYS):] + WAYS[:repeat % len(WAYS)]:  # each way first in turn
                round_ += 1
                sim.run_round(round_, everyone)
                sim.executor.evaluate = evaluator(way)
                start = time.perf_counter()
                sim.evaluate(round_)
                sim.evaluate(round_, "val")
                seconds[way].append(time.perf_counter() - start)
        accs = {}
        for way in WAYS:  # the same weights for every way: their accuracies must agree
            sim.executor.evaluate = evaluator(way)
            accs[way] = [a for _, a, _ in sim.evaluate(round_)[0]]
        for way in WAYS:
            rows.append({"precision": precision, "way": way, "seconds": seconds[way],
                         "same_acc": accs[way] == accs[WAYS[0]], "mean_acc": statistics.fmean(accs[way])})
    return {"header": {**machine_header("python bench/eval_speed.py"), "threads": torch.get_num_threads(),
                       "repeats": repeats, "clients": part.num_clients,
                       "test_rows": sum(len(c.y_test) for c in sim.clients),
                       "val_rows": sum(len(c.y_val) for c in sim.clients)},
            "rows": rows}


def table(result: dict) -> str:
    head = result["header"]
    lines = [machine_line(head) + f"K = {head['clients']}, {head['test_rows']:,} test and {head['val_rows']:,} "
             "validation rows in all, "
             f"ResNet-8, a FedCache round before each evaluation; {head['repeats']} repeats, interleaved; measured "
             f"{head['date']} "
             f"with `{head['command']}`.", "",
             "| precision | evaluation | s (median / best) | speed-up vs batched | mean test acc "
             "| same acc as the library |",
             "|---|---|---|---|---|---|"]
    for precision in dict.fromkeys(r["precision"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["precision"] == precision]
        batched = statistics.median(next(r for r in rows if r["way"] == "batched across clients")["seconds"])
        for r in rows:
            median = statistics.median(r["seconds"])
            lines.append(f"| {precision} | {r['way']} | {median:.2f} / {min(r['seconds']):.2f} | "
                         f"{batched / median:.2f}x | {100 * r['mean_acc']:.2f}% | {'yes' if r['same_acc'] else 'no'} |")
    return "\n".join(lines)


def docs_section(results: list[dict]) -> str:
    body = "\n\n".join(f"{section_heading(r)}\n\n{table(r)}" for r in results)
    intro = ("Generated by `.venv/bin/python bench/eval_speed.py --docs` from bench/results/eval-*.json (each "
             "written by `.venv/bin/python bench/eval_speed.py` on the CPU it names; bench/eval_speed.py says what "
             "each way is).")
    return f"{BEGIN}\n{intro}\n\n{body or 'Not measured yet.'}\n{END}"


def render_docs(results: list[dict], text: str) -> str:
    return replace_section(text, BEGIN, END, docs_section(results), HEADING)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--synthetic", action="store_true", help="random images of FashionMNIST's shape")
    ap.add_argument("--json", type=Path, default=None, help="result file (default bench/results/eval-<cpu>.json)")
    ap.add_argument("--docs", action="store_true", help="render bench/results/eval-*.json into docs/executors.md")
    ap.add_argument("--check", action="store_true", help="with --docs: exit 1 when docs/executors.md is stale")
    args = ap.parse_args(argv)
    if args.docs:
        results = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("eval-*.json"))]
        return write_or_check(DOCS, DOCS.read_text(), render_docs(results, DOCS.read_text()), args.check,
                              "bench/eval_speed.py --docs")
    result = measure(args.repeats, args.threads, args.synthetic)
    print(table(result))
    save_result(result, args.json or result_path("eval"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
