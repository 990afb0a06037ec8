"""Remote runs: register the deployments a Prefect worker runs (make worker does this first).

    PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python -m flows.deploy [--workdir DIR] [--pool NAME]

Two deployments on the process work pool `fedcache` (created when missing):
- `fedcache-pipeline/pipeline`: the whole pipeline on a params file, on the cron schedule of
  flows/serve.py (and on demand: `prefect deployment run fedcache-pipeline/pipeline`);
- `train/stage`: one training stage, with parameters algorithm, params_file and hetero
  (`prefect deployment run train/stage -p algorithm=fd`).

A worker (`prefect worker start --pool fedcache`) runs each flow run in a new process in DIR (the
checkout that registered them, by default this one): the stages read params.yaml and write
results/ relative to it, as `dvc repro` does. The deployments name the flows by module path
(`flows.pipeline.pipeline_flow`), so nothing is uploaded: every machine running a worker needs
this repository (with its .venv and data) at the same path.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import flows  # noqa: F401  (offline-safe Prefect defaults before Prefect is imported)
from flows import imports_done
from flows.serve import CRON

ROOT = Path(__file__).resolve().parent.parent
POOL = "fedcache"
PIPELINE = "pipeline"  # deployment names: fedcache-pipeline/pipeline and train/stage
STAGE = "stage"


def job_variables(workdir: Path) -> dict:
    """Where and with what environment the worker starts a flow run's process."""
    # PYTHONPATH: the flows package is imported by module path (flows/__init__.py then sets the
    # offline-safe defaults in the flow run's process)
    return {"working_dir": str(workdir), "env": {"PYTHONPATH": str(ROOT)}}


def build_deployments(workdir: Path, params_file: str = "params.yaml") -> list:
    """The two deployments (built without a server, so tests can check them)."""
    from prefect.deployments.runner import EntrypointType

    from flows.pipeline import pipeline_flow
    from flows.train import train_flow

    variables = job_variables(workdir)
    return [
        pipeline_flow.to_deployment(
            name=PIPELINE, cron=CRON, parameters={"params_file": params_file}, job_variables=variables,
            entrypoint_type=EntrypointType.MODULE_PATH,
            description=f"The whole pipeline on {params_file}, run by a worker in {workdir}"),
        train_flow.to_deployment(
            name=STAGE, parameters={"algorithm": "fedcache", "params_file": params_file, "hetero": False},
            job_variables=variables, entrypoint_type=EntrypointType.MODULE_PATH,
            description=f"One training stage (parameters: algorithm, params_file, hetero), run in {workdir}"),
    ]


def ensure_pool(name: str) -> None:
    """Create the process work pool `name` unless the server has it."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=name, type="process", base_job_template=ProcessWorker.get_default_base_job_template()))
            print(f"created the process work pool {name!r}")


def main(argv: list[str] | None = None) -> int:
    imports_done()  # flows/__init__.py paused the collector for `python -m` imports
    ap = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=ROOT, help="where flow runs start (default: this checkout)")
    ap.add_argument("--pool", default=POOL, help=f"process work pool (default: {POOL})")
    ap.add_argument("--params", default="params.yaml", help="params file, relative to --workdir")
    args = ap.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set: start a server (make server) and set it, e.g.\n"
              "  PREFECT_API_URL=http://127.0.0.1:4200/api .venv/bin/python -m flows.deploy", file=sys.stderr)
        return 2
    workdir = args.workdir.resolve()
    if not (workdir / args.params).is_file():
        print(f"error: {workdir / args.params} not found: --workdir must be a checkout with its params file",
              file=sys.stderr)
        return 2
    ensure_pool(args.pool)
    for deployment in build_deployments(workdir, args.params):
        deployment.apply(work_pool_name=args.pool)
        print(f"deployment {deployment.flow_name}/{deployment.name} on pool {args.pool!r}, runs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
