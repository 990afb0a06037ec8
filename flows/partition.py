"""Stage 1: dataset -> K clients (index arrays + stats)."""

from __future__ import annotations

import sys

import numpy as np

import flows  # noqa: F401  (offline-safe Prefect settings)
from prefect import flow, task

from pipeline import paths
from pipeline.config import Params, load_params
from pipeline.data.datasets import load_dataset
from pipeline.data.partition import Partition, check_clients_fit, make_partition, partition_stats, write_stats


@task
def split(params: Params) -> Partition:
    ds = load_dataset(params.data.dataset, params.data.root, params.data.download)
    check_clients_fit(params.partition, np.bincount(ds.train_y, minlength=ds.num_classes))  # what the split will use
    return make_partition(ds.train_y, ds.test_y, ds.num_classes, params.partition, params.seed)


@task
def save(part: Partition) -> dict:
    stats = partition_stats(part)
    part.save(paths.PARTITION)
    write_stats(stats, paths.PARTITION_STATS)
    return stats


@flow(name="partition")
def partition_flow(params_file: str = "params.yaml") -> dict:
    params = load_params(params_file, methods=())  # the shared sections: it runs no method
    stats = save(split(params))
    s = stats["train_per_client"]
    print(f"partition: {stats['num_clients']} clients, {stats['num_train']:,} train / {stats['num_val']:,} validation / "
          f"{stats['num_test']:,} test samples (train per client min {s['min']}, mean {s['mean']:.1f}, max {s['max']})")
    return stats


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(partition_flow))
