"""pDFL ablation: what each part of the paper's design adds, on the default setting.

    nice -n 10 .venv/bin/python bench/pdfl_ablation.py                 # params.yaml defaults, seed 0
    nice -n 10 .venv/bin/python bench/pdfl_ablation.py --seeds 0 1 2   # mean +- std over seeds

The default setting is params.yaml's: FashionMNIST, K=30 x 200 samples, Dirichlet alpha 1,
ResNet-8, 10 rounds, batch 8, and its `pdfl` section (time-varying Erdos-Renyi graph, about 7.6
neighbours a round). --clients / --samples / --alpha / --rounds change it. It runs with
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
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--samples", type=int, default=200, help="mean training samples per client")
    ap.add_argument("--alpha", type=float, default=1.0, help="Dirichlet alpha (params.yaml default: 1.0)")
    ap.add_argument("--rounds", type=int, default=10)
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
        work = prepare_workspace(f"{args.work}/seed{seed}", {
            "seed": seed,
            "device": "cpu",
            "data": {"dataset": "fashion_mnist"},
            "partition": {"num_clients": args.clients, "samples_per_client": args.samples, "alpha": args.alpha},
            "train": {"rounds": args.rounds, "algorithms": ["pdfl"], "model": "resnet8", "threads": 1},
        }, verbose=False)
        for variant, summary in run_variants(work).items():
            results[variant].append(summary)
        os.chdir(ROOT)

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    import numpy as np

    print(f"\npDFL ablation: FashionMNIST, K={args.clients} x {args.samples} samples, Dirichlet alpha={args.alpha}, "
          f"ResNet-8, {args.rounds} rounds, seeds {args.seeds}; pdfl section of params.yaml otherwise")
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
