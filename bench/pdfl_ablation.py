"""pDFL ablation: what each of its parts adds, on one small FashionMNIST setting.

    nice -n 10 .venv/bin/python bench/pdfl_ablation.py            # K=10 x 200 samples, ResNet-8, 10 rounds
    nice -n 10 .venv/bin/python bench/pdfl_ablation.py --rounds 20 --alpha 0.5 --seeds 0 1 2

It writes a params file to bench/.work/pdfl_ablation/ (params.yaml with the overrides below),
runs the partition stage's CLI there, then trains each variant in-process with the Trainer
(results in that folder's results/results.duckdb) and prints one table: MAUA (best mean
accuracy over rounds), final mean accuracy and total bytes, averaged over the seeds given.
Variants: full pDFL; attention off (uniform neighbour weights); internal KD off; external KD
off; body_then_head order; both KD off; no body aggregation (self_weight 1: bodies still
sent, only knowledge used); and local-only training as the no-exchange reference.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from workspace import ROOT, fresh_trainer, load_workspace, prepare_workspace

VARIANTS = {
    "full pDFL": {},
    "attention off (uniform)": {"attention": False},
    "internal KD off": {"internal_kd": False},
    "external KD off": {"external_kd": False},
    "body_then_head": {"order": "body_then_head"},
    "both KD off": {"internal_kd": False, "external_kd": False},
    "no aggregation (self_weight 1)": {"self_weight": 1.0},
    "local only (reference)": None,
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
              f"{summary['bytes_total'] / 1e6:8.2f} MB  {summary['wall_s']:.1f} s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=200, help="mean training samples per client")
    ap.add_argument("--alpha", type=float, default=1.0, help="Dirichlet alpha (params.yaml default: 1.0)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="run only these variants")
    args = ap.parse_args()
    if args.only:
        for variant in set(VARIANTS) - set(args.only):
            del VARIANTS[variant]

    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for seed in args.seeds:
        print(f"seed {seed}:", flush=True)
        work = prepare_workspace(f"pdfl_ablation/seed{seed}", {
            "seed": seed,
            "device": "cpu",
            "data": {"dataset": "fashion_mnist"},
            "partition": {"num_clients": args.clients, "samples_per_client": args.samples, "alpha": args.alpha},
            "train": {"rounds": args.rounds, "algorithms": ["pdfl"], "model": "resnet8"},
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
    for variant, runs in results.items():
        maua = [r["maua"] for r in runs]
        final = [r["final_acc"] for r in runs]
        pm = (lambda xs: f" ± {np.std(xs):.4f}") if spread else (lambda xs: "")  # noqa: E731
        print(f"| {variant} | {mean(maua):.4f}{pm(maua)} | {mean(final):.4f}{pm(final)} | "
              f"{mean([r['bytes_total'] for r in runs]) / 1e6:.2f} MB | {mean([r['wall_s'] for r in runs]):.1f} |")


if __name__ == "__main__":
    main()
