"""pDFL ablation: what each part of the paper's design adds, on the default setting.

    nice -n 10 .venv/bin/python bench/pdfl_ablation.py                 # params.yaml defaults, seed 0
    nice -n 10 .venv/bin/python bench/pdfl_ablation.py --seeds 0 1 2   # mean +- std over seeds

The default setting is params.yaml's (FashionMNIST; its partition, rounds, batch and `pdfl`
section), with ResNet-8. --clients / --samples / --alpha / --rounds change it. It runs with
train.threads 1 (one core: other benchmarks may use the other).

It writes a params file to bench/.work/pdfl_ablation/seed<s>/ (params.yaml with the overrides
below), runs the partition stage's CLI there, then trains each variant in-process with the
Trainer (results in that folder's results/results.duckdb) and prints one table: MAUA (best mean
accuracy over rounds), final mean accuracy and total bytes, mean +- std over the seeds given.
Variants: local-only training (the no-exchange reference, first so a partial log can be read);
full pDFL in the paper's order (head_then_body; params.yaml's default is body_then_head); attention off (uniform neighbour weights); internal KD off; external KD off (no
feedback copies trained or sent); order swapped (body_then_head).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import yaml
from workspace import ROOT, fresh_trainer, load_workspace, prepare_workspace

PAPER = {"order": "head_then_body"}  # every variant but the swapped one in the paper's order, as measured
VARIANTS = {
    "local only (reference)": None,
    "full pDFL": PAPER,
    "attention off (uniform)": {**PAPER, "attention": False},
    "internal KD off": {**PAPER, "internal_kd": False},
    "external KD off": {**PAPER, "external_kd": False},
    "order swapped (body_then_head)": {"order": "body_then_head"},
    "feedback teacher calibrated": {**PAPER, "external_calibrate": True},
}


DIAGNOSTICS = ("student_acc", "internal_teacher_acc", "external_teacher_acc")


def diagnostics(run_id: str) -> dict[str, list[float]]:
    """pDFL's per-round teacher diagnostics (round metrics): the client's own model on its training samples at
    the start of the round, and how often each teacher's argmax is the label there (means over clients)."""
    import duckdb

    from pipeline import paths

    with duckdb.connect(str(paths.RESULTS_DB), read_only=True) as con:
        rows = con.execute("SELECT name, round, value FROM round_metrics WHERE run_id = ? AND name IN (?, ?, ?) "
                           "ORDER BY name, round", [run_id, *DIAGNOSTICS]).fetchall()
    out: dict[str, list[float]] = {}
    for name, _, value in rows:
        out.setdefault(name, []).append(round(value, 3))
    return {name: out[name] for name in DIAGNOSTICS if name in out}


def run_variants(work: Path) -> dict[str, dict]:
    base, part, ds = load_workspace(work)
    out = {}
    for i, (variant, overrides) in enumerate(VARIANTS.items()):
        algorithm = "local" if overrides is None else "pdfl"
        params = base if overrides is None else base.model_copy(
            update={"pdfl": base.pdfl.model_copy(update=overrides)})
        start = time.perf_counter()
        trainer = fresh_trainer(params, algorithm, part, ds, run_name=f"ablation-{i}")
        summary = trainer.run()
        summary["wall_s"] = time.perf_counter() - start
        out[variant] = summary
        print(f"  {variant:32s} MAUA {summary['maua']:.4f}  final {summary['final_acc']:.4f}  "
              f"{summary['bytes_total'] / 1e6:8.2f} MB  {summary['wall_s']:.1f} s  "
              f"acc/round {[round(a, 3) for _, a in trainer.history if a is not None]}", flush=True)
        for name, values in diagnostics(summary["run_id"]).items():
            print(f"    {name:28s} by round {values}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, help="clients (default: params.yaml's)")
    ap.add_argument("--samples", type=int, help="mean training samples per client (default: params.yaml's)")
    ap.add_argument("--alpha", type=float, help="Dirichlet alpha (default: params.yaml's)")
    ap.add_argument("--rounds", type=int, help="rounds (default: params.yaml's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="run only these variants")
    ap.add_argument("--work", default="pdfl_ablation",
                    help="folder under bench/.work/ (a second process running other variants needs its own)")
    args = ap.parse_args()
    if args.only:
        for variant in set(VARIANTS) - set(args.only):
            del VARIANTS[variant]
        order = [v for v in args.only]  # in the order given
        VARIANTS.update({v: VARIANTS.pop(v) for v in order})

    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for seed in args.seeds:
        print(f"seed {seed}:", flush=True)
        partition = {"num_clients": args.clients, "samples_per_client": args.samples, "alpha": args.alpha}
        work = prepare_workspace(f"{args.work}/seed{seed}", {
            "seed": seed,
            "device": "cpu",
            "data": {"dataset": "fashion_mnist"},
            "partition": {k: v for k, v in partition.items() if v is not None},
            "train": {"algorithms": ["pdfl"], "model": "resnet8", "threads": 1,
                      **({"rounds": args.rounds} if args.rounds else {})},
        }, verbose=False)
        for variant, summary in run_variants(work).items():
            results[variant].append(summary)
        os.chdir(ROOT)

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    import numpy as np

    used = yaml.safe_load((work / "params.yaml").read_text())  # the setting (every seed's but for the seed)
    part, train = used["partition"], used["train"]
    print(f"\npDFL ablation: FashionMNIST, K={part['num_clients']} x {part['samples_per_client']} samples, "
          f"Dirichlet alpha={part['alpha']}, ResNet-8, {train['rounds']} rounds, seeds {args.seeds}; "
          "pdfl section of params.yaml otherwise")
    spread = len(args.seeds) > 1
    print("| variant | MAUA | final acc | total bytes | wall s / run |")
    print("|---|---|---|---|---|")
    results = {v: runs for v, runs in results.items() if runs}
    for variant, runs in results.items():
        maua = [r["maua"] for r in runs]
        final = [r["final_acc"] for r in runs]
        pm = (lambda xs: f" ± {np.std(xs):.4f}") if spread else (lambda xs: "")  # noqa: E731
        print(f"| {variant} | {mean(maua):.4f}{pm(maua)} | {mean(final):.4f}{pm(final)} | "
              f"{mean([r['bytes_total'] for r in runs]) / 1e6:.2f} MB | {mean([r['wall_s'] for r in runs]):.1f} |")


if __name__ == "__main__":
    main()
