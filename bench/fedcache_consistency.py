"""FedCache's `consistency` (live | step | round) measured side by side: MAUA, final accuracy, wall time.

    .venv/bin/python bench/fedcache_consistency.py                       # params.yaml, seeds 0 1 2
    .venv/bin/python bench/fedcache_consistency.py --seeds 0 --rounds 3
    .venv/bin/python bench/fedcache_consistency.py --official-demo --seeds 0   # about 1 h on 2 cores

For each seed it prepares bench/.work/fedcache_consistency/seed<s>/ (params.yaml with `seed`
overridden; the partition, encode and index stages run there through their CLIs), then trains
FedCache in-process once per consistency on the same partition, cache and initial weights: `live`
on the sequential executor (as it must), `step` and `round` on params.yaml's executor. Prints one
line per run and a table of mean +- std over the seeds (std with ddof 1). Run on an idle machine.

--official-demo is the official FedCache repository's demo setting instead of params.yaml's scale:
K = 20 clients over all 60,000 FashionMNIST training images (Dirichlet alpha 1.0), A1/A2/A3 by
client index mod 3, batch 8, lr 0.01 with a fresh optimizer every round, beta 1.5, T 3, knowledge
starting at zeros, 3 rounds, evaluated every round.
"""

from __future__ import annotations

import argparse
import time

from workspace import deep_merge, fresh_trainer, load_workspace, prepare_workspace, print_seed_table

CONSISTENCIES = ("live", "step", "round")

OFFICIAL_DEMO = {
    "partition": {"scheme": "dirichlet", "num_clients": 20, "alpha": 1.0, "samples_per_client": None,
                  "data_fraction": None},
    "index": {"R": 16},
    "train": {"rounds": 3, "eval_every": 1, "batch_size": 8, "lr": 0.01, "momentum": 0.9,
              "weight_decay": 0.0005, "fresh_optimizer": True, "local_epochs": 1, "participation": 1.0},
    "fedcache": {"beta": 1.5, "T": 3.0, "cold_start": "zeros"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, help="rounds (default: params.yaml's)")
    ap.add_argument("--only", nargs="+", choices=CONSISTENCIES, default=list(CONSISTENCIES))
    ap.add_argument("--official-demo", action="store_true",
                    help="the official code's demo setting (K = 20, all 60k samples, A1/A2/A3, 3 rounds)")
    args = ap.parse_args()
    setting = OFFICIAL_DEMO if args.official_demo else {}
    name = "fedcache_consistency_demo" if args.official_demo else "fedcache_consistency"

    results: dict[str, list[dict]] = {c: [] for c in args.only}
    for seed in args.seeds:
        overrides = deep_merge(setting, {"seed": seed, **({"train": {"rounds": args.rounds}} if args.rounds else {})})
        work = prepare_workspace(f"{name}/seed{seed}", overrides, ("partition", "encode", "index"))
        base, part, ds = load_workspace(work)
        for consistency in args.only:
            params = base.model_copy(update={"fedcache": base.fedcache.model_copy(update={"consistency": consistency})})
            start = time.perf_counter()
            summary = fresh_trainer(params, "fedcache", part, ds, run_name=f"consistency-{consistency}",
                                    hetero=args.official_demo).run()
            summary["wall_s"] = time.perf_counter() - start
            results[consistency].append(summary)
            print(f"seed {seed} {consistency:5s}: MAUA {summary['maua']:.4f}  final {summary['final_acc']:.4f}  "
                  f"{summary['bytes_total'] / 1e6:.2f} MB  {summary['wall_s']:.1f} s", flush=True)

    print_seed_table("consistency", results, len(args.seeds))

if __name__ == "__main__":
    main()
