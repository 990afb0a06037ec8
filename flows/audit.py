"""Stage 5 (one per trained run): the privacy audit, what an honest-but-curious server and a third party holding a
client's final model learn from that run -> results/audit/<name>/audit.json (pipeline/audit/run.py; docs/privacy.md).

    .venv/bin/python -m flows.audit <algorithm> [--hetero] [--params params.yaml]

It reads only what the run's training kept for it (results/runs/<name>/audit/: a seeded sample of the uploads and
the audited clients' final models; audit.capture), the partition and the dataset (the attacker's public samples,
and the clients' own images to score a reconstruction against).
"""

from __future__ import annotations

import json
import sys
import time

import flows  # noqa: F401
from prefect import flow
# torch.optim imports torch._dynamo at a model's first step (1.32 s); imported here, while the collector is
# paused (flows/__init__.py), it costs 1.07 s
import torch._dynamo  # noqa: F401,E402

from pipeline import paths
from pipeline.audit.run import audit_run
from pipeline.config import load_params
from pipeline.data.datasets import load_dataset
from pipeline.data.partition import Partition
from pipeline.results.privacy import figures


@flow(name="audit", flow_run_name="audit-{algorithm}")
def audit_flow(algorithm: str, params_file: str = "params.yaml", hetero: bool = False) -> dict:
    start = time.perf_counter()
    params = load_params(params_file, methods=(algorithm,))
    part = Partition.load(paths.PARTITION)
    ds = load_dataset(params.data.dataset, params.data.root, params.data.download)
    if params.audit.capture:
        result = audit_run(params, algorithm, part, ds, paths.run_dir(algorithm, hetero), hetero)
    else:  # nothing kept to attack: say so (the report leaves the run out of its privacy table)
        result = {"run": paths.run_name(algorithm, hetero), "method": algorithm, "captured": False,
                  "summary": "not audited: audit.capture is false, so training kept nothing to attack"}
    summary = paths.run_dir(algorithm, hetero) / "summary.json"  # the run audited, for the results index
    result["run_id"] = json.loads(summary.read_text())["run_id"] if summary.is_file() else None
    result["figures"] = figures(paths.run_name(algorithm, hetero), result)  # the results index's privacy rows
    result["seconds"] = round(time.perf_counter() - start, 2)
    out = paths.audit_file(algorithm, hetero)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"audit {paths.run_name(algorithm, hetero)}: {result['summary']} ({result['seconds']:.1f} s) -> {out}")
    return result


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(audit_flow, positional=("algorithm",), flags=("hetero",),
                       methods=lambda args: (args["algorithm"],)))
