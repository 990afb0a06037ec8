"""FedProto's extensions, each on its own against the baseline: accuracy and bytes.

    nice -n 10 .venv/bin/python bench/fedproto_extensions.py                 # all variants
    nice -n 10 .venv/bin/python bench/fedproto_extensions.py --variants baseline int8

The setting (defaults): FashionMNIST, K=10 clients x 200 training samples (Dirichlet alpha from
params.yaml), ResNet-8, 10 rounds, full participation, the train.* settings of params.yaml.
It writes a params file into bench/.work/fedproto/ and runs the partition stage CLI there
(FedProto needs no encode/index), then runs one Trainer in-process per variant (fresh run,
results in that directory's DuckDB) and prints a Markdown table: MAUA and final accuracy of the
round figure (the local classifier, fedproto.eval: classifier), the nearest-prototype reading
(its maximum over rounds and its final value), total bytes (up + down) and bytes up.
"""

from __future__ import annotations

import argparse
import time

from workspace import fresh_trainer, load_workspace, prepare_workspace

VARIANTS: dict[str, dict] = {
    "baseline": {},
    "lambda=0": {"lambda": 0.0},  # prototypes still exchanged, but no pull toward them: a local-only reference
    "uniform": {"aggregation": "uniform"},
    "median": {"prototype": "median"},
    "confidence": {"aggregation": "confidence"},
    "align": {"align": True},
    "int8": {"encode_up": "int8", "encode_down": "int8"},  # a byte a value both ways (fedproto.encode_up/down)
    "topk:7": {"encode_up": "topk:7"},  # each prototype's 7 largest-magnitude of 64 values up
    "topk:16": {"encode_up": "topk:16"},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=200, help="mean training samples per client")
    ap.add_argument("--seed", type=int, default=None, help="root seed (default: params.yaml's)")
    args = ap.parse_args()
    setting = {
        "data": {"dataset": "fashion_mnist"},
        "partition": {"num_clients": args.clients, "samples_per_client": args.samples, "data_fraction": None},
        "train": {"rounds": args.rounds, "algorithms": ["fedproto"], "hetero_algorithms": [], "model": "resnet8",
                  "participation": 1.0, "eval_every": 1},
    }
    if args.seed is not None:
        setting["seed"] = args.seed
    work = prepare_workspace("fedproto", setting)  # FedProto needs the partition only
    base, part, ds = load_workspace(work)
    print(f"FashionMNIST (seed {base.seed}): K={part.num_clients}, {part.num_train} training / {len(part.test_labels)} test samples, "
          f"ResNet-8, {base.train.rounds} rounds, batch {base.train.batch_size}, lr {base.train.lr}, "
          f"torch threads {base.train.threads}", flush=True)
    table = []
    for name in args.variants:
        overrides = {("lambda_" if k == "lambda" else k): v for k, v in VARIANTS[name].items()}
        params = base.model_copy(update={"fedproto": base.fedproto.model_copy(update=overrides)})
        start = time.perf_counter()
        trainer = fresh_trainer(params, "fedproto", part, ds, run_name=f"fedproto-{name}")  # always a fresh run
        summary = trainer.run()
        wall = time.perf_counter() - start
        with trainer.results.connect(read_only=True) as con:
            proto = [v for (v,) in con.execute("SELECT value FROM round_metrics WHERE run_id = ? AND name = "
                                               "'acc_prototype' ORDER BY round", [summary["run_id"]]).fetchall()]
        table.append((name, summary["maua"], summary["final_acc"], max(proto[1:]), proto[-1], summary["bytes_total"],
                      summary["bytes_up"], wall))
        print(f"  {name}: MAUA {summary['maua']:.4f}, {summary['bytes_total']:,} B, {wall:.0f} s", flush=True)

    print("\n| variant | MAUA (classifier) | final acc (classifier) | max acc (prototype) | final acc (prototype) "
          "| bytes up+down | bytes up | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, maua, final, pmax, pfinal, total, up, wall in table:
        print(f"| {name} | {maua:.4f} | {final:.4f} | {pmax:.4f} | {pfinal:.4f} | {total:,} | {up:,} | {wall:.0f} |")


if __name__ == "__main__":
    main()
