"""The whole pipeline as one Prefect flow: the stage flows in order, as subflows
(partition, encode, index, train for each algorithm, its audit, report).

`dvc repro` is the way to run stages incrementally; this flow is what a schedule runs
(flows/serve.py), re-running every stage from params.yaml.
"""

from __future__ import annotations

import sys

import flows  # noqa: F401
from prefect import flow

from flows.audit import audit_flow
from flows.cli import without_heartbeats
from flows.encode import encode_flow
from flows.index import index_flow
from flows.partition import partition_flow
from flows.report import report_flow
from flows.train import train_flow
from pipeline.config import load_params


@flow(name="fedcache-pipeline")
def pipeline_flow(params_file: str = "params.yaml") -> dict:
    with without_heartbeats():  # the subflows': this flow's own speak for them (flows/cli.py)
        out = {
            "partition": partition_flow(params_file),
            "encode": encode_flow(params_file),
            "index": index_flow(params_file),
        }
        train = load_params(params_file, methods=()).train
        for algorithm in train.algorithms:
            out[f"train@{algorithm}"] = train_flow(algorithm, params_file)
        for algorithm in train.hetero_algorithms:
            out[f"train-hetero@{algorithm}"] = train_flow(algorithm, params_file, hetero=True)
        for algorithm in train.algorithms:  # dvc.yaml's audit@<algorithm>: after the runs, as `dvc repro` orders it
            out[f"audit@{algorithm}"] = audit_flow(algorithm, params_file)
        for algorithm in train.hetero_algorithms:
            out[f"audit-hetero@{algorithm}"] = audit_flow(algorithm, params_file, hetero=True)
        out["report"] = report_flow(params_file)
    return out


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(pipeline_flow))
