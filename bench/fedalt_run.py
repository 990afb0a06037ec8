"""One small FedAlt run on FashionMNIST: accuracy per round (final exit, every exit, the global model)
and bytes per block. For the comparison of FedAlt's parts on the default setting see bench/fedalt_tiers.py.

    nice -n 10 .venv/bin/python bench/fedalt_run.py                 # K=10 x 200 samples, 10 rounds
    .venv/bin/python bench/fedalt_run.py --rounds 20 --tau 5 --lambda 0 --capacity 0.3 0.4 0.3 --congestion 0.2

It prepares the inputs in bench/.work/fedalt/ (params.yaml, then the partition stage's CLI;
FedAlt needs neither hashes nor the neighbour index), runs the rounds in-process with the
engine's Trainer and prints MAUA, final accuracy and bytes, with the bytes a full-model
exchange every round (FedAvg-style, same multi-exit model) would have cost for comparison.
"""

from __future__ import annotations

import argparse
import time

from workspace import fresh_trainer, load_workspace, prepare_workspace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tau", type=int, default=5)
    ap.add_argument("--lambda", dest="lam", type=float, default=1.0)
    ap.add_argument("--capacity", type=float, nargs=3, default=None, help="P(compute tier = 1, 2, 3 blocks)")
    ap.add_argument("--congestion", type=float, default=None, help="per-round link congestion probability")
    args = ap.parse_args()
    overrides = {
        "data": {"dataset": "fashion_mnist"},
        "partition": {"num_clients": args.clients, "samples_per_client": args.samples},
        "train": {"rounds": args.rounds, "algorithms": ["fedalt"], "hetero_algorithms": []},
        "fedalt": {"tau": args.tau, "lambda": args.lam},
    }
    if args.capacity:
        overrides["fedalt"]["capacity"] = args.capacity
    if args.congestion is not None:
        overrides["fedalt"]["congestion"] = args.congestion
    work = prepare_workspace("fedalt", overrides)  # FedAlt needs the partition only
    params, part, ds = load_workspace(work)

    from models.multiexit import NUM_BLOCKS, block_state
    from pipeline.federation.ledger import DOWN, UP, nbytes

    trainer = fresh_trainer(params, "fedalt", part, ds)
    f = params.fedalt
    print(f"FedAlt on {ds.name}: K={part.num_clients}, {part.num_train} train / {int(part.test_offsets[-1])} test samples, "
          f"{params.train.rounds} rounds, capacity {f.capacity}, congestion {f.congestion}, tau {f.tau} (full model "
          f"every {f.tau + 1} rounds), lambda {f.lambda_} ({f.distill}), T {f.T}, "
          f"batch {params.train.batch_size}, threads {params.train.threads}")
    extras: dict[str, float] = {}
    evaluate = trainer.server.evaluate

    def keep_extras(round_: int):  # the per-exit accuracies, as written to round_metrics
        rows, ex = evaluate(round_)
        extras.update(ex)
        return rows, ex

    trainer.server.evaluate = keep_extras
    start = time.perf_counter()
    first = trainer.start()
    print("| round | block payloads down | mean acc (final) | exit 1 | exit 2 | global model | bytes up | bytes down "
          "| wall s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rnd in range(first, params.train.rounds + 1):
        t0 = time.perf_counter()
        trainer.run_round(rnd)
        acc = trainer.history[-1][1]
        led = trainer.ledger
        sent = sum(1 for (_, _, d, _, _, _) in led.rows(rnd) if d == DOWN)
        print(f"| {rnd} | {sent} | {acc:.4f} | "
              f"{extras['acc_exit1']:.4f} | {extras['acc_exit2']:.4f} | {extras['acc_global']:.4f} | {led.total(rnd, UP):,} | "
              f"{led.total(rnd, DOWN):,} | {time.perf_counter() - t0:.1f} |", flush=True)
    summary = trainer.finish()
    state = trainer.clients[0].model.state_dict()
    sizes = {b: sum(nbytes(t) for t in block_state(state, b).values()) for b in range(1, NUM_BLOCKS + 1)}
    full = 2 * sum(sizes.values()) * part.num_clients * params.train.rounds
    print(f"\nblock sizes (bytes per transfer): {sizes}")
    print(f"MAUA {summary['maua']:.4f}, final acc {summary['final_acc']:.4f}, bytes {summary['bytes_total']:,} "
          f"(up {summary['bytes_up']:,}, down {summary['bytes_down']:,}); the whole model both ways every round "
          f"would be {full:,} ({summary['bytes_total'] / full:.1%} of it); {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
