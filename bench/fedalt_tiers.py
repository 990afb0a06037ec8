"""FedAlt on the default setting: which part of the design costs or buys accuracy, and the bytes.

    nohup nice -n 10 .venv/bin/python bench/fedalt_tiers.py --seeds 0 1 2 > bench/.work/fedalt_tiers.log 2>&1 &
    .venv/bin/python bench/fedalt_tiers.py --seeds 0 --only "FedAlt (default)" "local, multi-exit"

Setting: params.yaml's defaults (FashionMNIST, K = 30 x 200 samples, Dirichlet alpha 1,
10 rounds, batch 8, the `fedalt` section as written) with `train.threads: 1` (so that two
benchmarks on a 2-core machine do not oversubscribe it) and `device: cpu`. For each seed it
prepares bench/.work/fedalt_tiers/seed<s>/ (params.yaml + the partition stage), trains every
variant in-process with the engine's Trainer and prints MAUA (best mean personal accuracy over
rounds), final mean accuracy, the global model's mean accuracy on the clients' test splits
(`acc_global`, last round and best) and bytes; then a table with mean ± std over the seeds.
Results also go to bench/.work/fedalt_tiers/results.json (rewritten after every run).

Variants (all on the multi-exit ResNet-20 except the last):
  FedAlt (default)        the fedalt section as written (capacity tiers, congestion, tau, two-way SD);
  all-full                every client gets the whole model every round (capacity [0, 0, 1],
                          no congestion): FedAvg on the multi-exit model with self-distillation,
                          personal model = the global model after one local epoch;
  all-full, lambda 0      the same without self-distillation (plain FedAvg on the multi-exit model);
  lambda 0                FedAlt without self-distillation;
  one-way SD              FedAlt with one-way distillation (exits learn from the final output only);
  SD warm-up 5            FedAlt with lambda ramped over the first 5 rounds;
  local, multi-exit       no exchange at all (a Server that sends nothing), same model and loss;
  local, ResNet-8         the pipeline's `local` method (train.model), the usual reference.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from workspace import ROOT, load_workspace, prepare_workspace

VARIANTS: dict[str, dict | str] = {
    "FedAlt (default)": {},
    "local, multi-exit": "local-multiexit",
    "all-full": {"capacity": [0.0, 0.0, 1.0], "congestion": 0.0},
    "lambda 0": {"lambda_": 0.0},
    "one-way SD": {"distill": "one_way"},
    "all-full, lambda 0": {"capacity": [0.0, 0.0, 1.0], "congestion": 0.0, "lambda_": 0.0},
    "local, ResNet-8": "local",
    "SD warm-up 5": {"distill_warmup": 5},
}


def local_multiexit_cls():
    """FedAlt's model, loss and evaluation with no exchange: nothing is sent either way."""
    from pipeline.federation.contract import Upload
    from pipeline.methods.fedalt.method import FedAlt, FedAltClient

    class LocalMultiExitClient(FedAltClient):
        def end(self, client, targets, records, round_):
            return Upload()

    class LocalMultiExit(FedAlt):
        client_cls = LocalMultiExitClient

        def configure(self, round_, selected):
            return {k: [] for k in selected}

        def aggregate(self, round_, uploads):
            pass

    return LocalMultiExit


def trainer_for(params, cls, part, ds, run_name: str):
    from pipeline import paths
    from pipeline.train.engine import Trainer
    from pipeline.results.store import ResultsDB

    ckpt = paths.CHECKPOINTS / f"{run_name}.pt"
    ckpt.unlink(missing_ok=True)
    return Trainer(params, cls, part, ds, paths.RUNS / run_name, ckpt, ResultsDB(paths.RESULTS_DB), [paths.PARTITION])


def run_variant(base, part, ds, variant: str, spec, index: int) -> dict:
    from pipeline.methods.registry import REGISTRY

    if spec == "local":
        params, cls = base, REGISTRY["local"]
    elif spec == "local-multiexit":
        params, cls = base, local_multiexit_cls()
    else:
        params, cls = base.model_copy(update={"fedalt": base.fedalt.model_copy(update=spec)}), REGISTRY["fedalt"]
    trainer = trainer_for(params, cls, part, ds, f"variant-{index}")
    extras: list[dict] = []
    evaluate = trainer.server.evaluate

    def keep_extras(round_: int):
        rows, ex = evaluate(round_)
        extras.append(ex)
        return rows, ex

    trainer.server.evaluate = keep_extras
    start = time.perf_counter()
    summary = trainer.run()
    out = {k: summary[k] for k in ("maua", "final_acc", "bytes_total", "bytes_up", "bytes_down")}
    out["wall_s"] = time.perf_counter() - start
    out["history"] = [acc for _, acc in trainer.history]
    glob = [e["acc_global"] for e in extras if "acc_global" in e]
    if glob and spec != "local-multiexit":  # a method that never aggregates has no meaningful global model
        out["global_final"], out["global_best"] = glob[-1], max(glob)
    for i in (1, 2):
        if extras and f"acc_exit{i}" in extras[-1]:
            out[f"exit{i}_final"] = extras[-1][f"acc_exit{i}"]
    return out


def fmt(xs: list[float], spread: bool) -> str:
    import numpy as np

    if not xs:
        return "—"
    return f"{np.mean(xs):.4f}" + (f" ± {np.std(xs):.4f}" if spread and len(xs) > 1 else "")


def print_table(results: dict[str, list[dict]], seeds: list[int], setting: str) -> None:
    import numpy as np

    done = {v: runs for v, runs in results.items() if runs}
    spread = len(seeds) > 1
    print(f"\nFedAlt variants: {setting}, seeds {seeds}, train.threads 1, CPU; mean ± std over the seeds finished")
    print("| variant | seeds | MAUA | final acc | acc_global final | acc_global best | exit 1 / exit 2 final | "
          "total bytes | wall s / run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, runs in done.items():
        ex = [f"{np.mean([r[f'exit{i}_final'] for r in runs]):.3f}" for i in (1, 2) if f"exit{i}_final" in runs[0]]
        print(f"| {variant} | {len(runs)} | {fmt([r['maua'] for r in runs], spread)} | "
              f"{fmt([r['final_acc'] for r in runs], spread)} | "
              f"{fmt([r['global_final'] for r in runs if 'global_final' in r], spread)} | "
              f"{fmt([r['global_best'] for r in runs if 'global_best' in r], spread)} | "
              f"{' / '.join(ex) or '—'} | {np.mean([r['bytes_total'] for r in runs]) / 1e6:.1f} MB | "
              f"{np.mean([r['wall_s'] for r in runs]):.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="run only these variants")
    ap.add_argument("--clients", type=int, help="K (default: params.yaml); smaller for a smoke run")
    ap.add_argument("--rounds", type=int, help="rounds (default: params.yaml)")
    ap.add_argument("--tag", default="", help="a second process's own folder bench/.work/fedalt_tiers-<tag>/")
    args = ap.parse_args()
    variants = {v: s for v, s in VARIANTS.items() if not args.only or v in args.only}

    name = "fedalt_tiers" + (f"-{args.tag}" if args.tag else "")
    out_file = ROOT / "bench" / ".work" / name / "results.json"
    results: dict[str, list[dict]] = {v: [] for v in variants}
    for seed in args.seeds:
        print(f"seed {seed}:", flush=True)
        work = prepare_workspace(f"{name}/seed{seed}", {
            "seed": seed,
            "device": "cpu",
            "train": {"algorithms": ["fedalt", "local"], "hetero_algorithms": [], "threads": 1,
                      **({"rounds": args.rounds} if args.rounds else {})},
            **({"partition": {"num_clients": args.clients}} if args.clients else {}),
        }, verbose=False)
        base, part, ds = load_workspace(work)
        for variant, spec in variants.items():
            r = run_variant(base, part, ds, variant, spec, list(VARIANTS).index(variant))
            r["seed"] = seed
            results[variant].append(r)
            g = f"  global {r['global_final']:.4f}" if "global_final" in r else ""
            print(f"  {variant:22s} MAUA {r['maua']:.4f}  final {r['final_acc']:.4f}{g}  "
                  f"{r['bytes_total'] / 1e6:8.1f} MB  {r['wall_s']:.0f} s", flush=True)
            out_file.write_text(json.dumps(results, indent=1))
        os.chdir(ROOT)
        p = base.partition
        setting = (f"{ds.name}, K={p.num_clients} x {p.samples_per_client} samples, Dirichlet alpha {p.alpha}, "
                   f"{base.train.rounds} rounds, batch {base.train.batch_size}")
        print_table(results, args.seeds, setting)


if __name__ == "__main__":
    main()
