"""The dashboard's load benchmark's results file (bench/dashboard_load.py): many finished runs at the default
scale's shape, written with sample_data's run writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dashboard.sample_data import SampleInputs, build_stage_outputs, curve, inputs, params_for, write_run
from pipeline.results.store import ResultsDB


# params.yaml's methods, with made-up final accuracies for the bench's runs
BENCH_ALGORITHMS = {"fedcache": 0.80, "fd": 0.74, "fedavg": 0.70, "fedproto": 0.72, "local": 0.66, "pdfl": 0.71,
                    "fedalt": 0.69}


def write_bench_runs(db: ResultsDB, root: Path, runs: int = 20, clients: int = 30, rounds: int = 30) -> list[str]:
    """A results file of `runs` finished runs at the default scale's shape (clients clients, rounds rounds,
    every client evaluated each round, per-client traffic rows), for bench/dashboard_load.py: the methods
    of params.yaml in turn (so the latest of each is selected, its earlier repeats not), and, from 12 runs
    up, 6 of them as the alpha sweep (FedCache and FD at alpha 1, 3, 10: the Ablations tab). Returns the
    run ids, oldest first."""
    sizes = np.full(clients, 200)
    base = params_for(root, algorithms=list(BENCH_ALGORITHMS), rounds=rounds)
    base["partition"] = {**base["partition"], "num_clients": clients, "samples_per_client": 200}
    swept = [("fedcache" if i % 2 == 0 else "fd", [1.0, 3.0, 10.0][i // 2]) for i in range(6 if runs >= 12 else 0)]
    ids = []
    methods = list(BENCH_ALGORITHMS)
    for i in range(runs - len(swept)):
        algorithm = methods[i % len(methods)]
        ids.append(f"{algorithm}-20260501-{i:04d}00-run{i:03d}")  # legend label: '<method>/homo run007'
        final = BENCH_ALGORITHMS[algorithm] + 0.005 * (i // len(methods))  # a repeat does a little better
        write_run(db, ids[-1], algorithm, "homo", base, sizes, curve(final, rounds), seed=200 + i)
    for j, (algorithm, alpha) in enumerate(swept):
        ids.append(f"{algorithm}-20260501-{runs + j:04d}00-run{runs + j:03d}")
        params = {**base, "partition": {**base["partition"], "alpha": alpha}}
        final = BENCH_ALGORITHMS[algorithm] + 0.02 * (j // 2)  # less skew (larger alpha), higher accuracy
        write_run(db, ids[-1], algorithm, "homo", params, sizes, curve(final, rounds), seed=300 + j,
                  experiment=f"ablation_alpha-alpha-{alpha:g}",
                  changed={"train.algorithms": ["fedcache", "fd"],
                           **({"partition.alpha": alpha} if alpha != 1 else {})})
    return ids


def build_bench(root: Path, runs: int = 20, clients: int = 30, rounds: int = 30) -> SampleInputs:
    """Stage outputs (partition and cache of `clients` clients) and write_bench_runs' results file under root."""
    out = inputs(root)
    build_stage_outputs(out.root, clients=clients)
    write_bench_runs(ResultsDB(out.results_db, lock_timeout_s=30), out.root, runs, clients, rounds)
    return out
