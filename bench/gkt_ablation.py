"""FedICT against FedDKC, one difference at a time: where does FedICT's gap come from?

    .venv/bin/python bench/gkt_ablation.py                    # 6 variants x seeds 0 1 2, about an hour on 2 cores
    .venv/bin/python bench/gkt_ablation.py --seeds 0 --rounds 3

The two share FedGKT's exchange and differ only in their two distillation terms (docs/methods/
fedict.md). The variants walk from FedICT to FedDKC:

  fedict                       the official defaults: FPKD's prior (1 + d_k,c / 3), LKA's similarity
  fedict prior_T=null          no prior: a plain KL on the clients
  fedict similarity=false      no similarity: every client's knowledge weighs 1 on the server
  fedict both off              a plain KL in both directions (FedGKT's losses, beta on CE on the server)
  feddkc                       the official defaults: KKR on logits scaled by 1/S (S = 0.05)
  feddkc S=1                   KKR without the scaling

Setting: params.yaml's scale (K = 20 x 100 FashionMNIST samples, Dirichlet 1.0) with A1/A2/A3
clients by index mod 3, as Table 6, a fresh optimizer every round, A4^S on batches of 32, 8
rounds, one torch thread. For each seed it prepares bench/.work/gkt_ablation/seed<s>/ (the partition stage), then
trains every variant in-process on the same partition and initial weights. Prints one line per run
and a table of mean +- std over the seeds (std with ddof 1).
"""

from __future__ import annotations

import argparse
import time

from workspace import fresh_trainer, load_workspace, prepare_workspace, print_seed_table

VARIANTS: dict[str, tuple[str, dict]] = {
    "fedict": ("fedict", {}),
    "fedict prior_T=null": ("fedict", {"prior_T": None}),
    "fedict similarity=false": ("fedict", {"similarity": False}),
    "fedict both off": ("fedict", {"prior_T": None, "similarity": False}),
    "feddkc": ("feddkc", {}),
    "feddkc S=1": ("feddkc", {"S": 1.0}),
}

SETTING = {"train": {"rounds": 8, "fresh_optimizer": True, "threads": 1},
           "feddkc": {"server_batch_size": 32}, "fedict": {"server_batch_size": 32}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, help="rounds (default: 8)")
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = ap.parse_args()

    results: dict[str, list[dict]] = {v: [] for v in args.only}
    for seed in args.seeds:
        train = {**SETTING["train"], **({"rounds": args.rounds} if args.rounds else {})}
        work = prepare_workspace(f"gkt_ablation/seed{seed}", {**SETTING, "seed": seed, "train": train}, ("partition",))
        base, part, ds = load_workspace(work)
        for variant in args.only:
            method, knobs = VARIANTS[variant]
            section = getattr(base, method).model_copy(update=knobs)
            params = base.model_copy(update={method: section})
            start = time.perf_counter()
            run_name = "ablation-" + variant.replace(" ", "-").replace("=", "-")
            summary = fresh_trainer(params, method, part, ds, run_name=run_name, hetero=True).run()
            summary["wall_s"] = time.perf_counter() - start
            results[variant].append(summary)
            print(f"seed {seed} {variant:24s}: MAUA {summary['maua']:.4f}  final {summary['final_acc']:.4f}  "
                  f"{summary['wall_s']:.1f} s", flush=True)

    print_seed_table("variant", results, len(args.seeds))

if __name__ == "__main__":
    main()
