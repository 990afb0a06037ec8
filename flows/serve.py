"""Serve the whole-pipeline flow on a cron schedule from a local Prefect server (make serve).

Starts `prefect server start --host 127.0.0.1` (never 0.0.0.0) unless PREFECT_API_URL
already points at a server, then serves the deployment until interrupted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import flows  # noqa: F401
from flows import imports_done

DEPLOYMENT_NAME = "scheduled"
CRON = "0 3 * * *"  # every day at 03:00 (server time zone: UTC)
HOST, PORT = "127.0.0.1", 4200


def build_deployment(params_file: str = "params.yaml"):
    """The deployment object (built without any server, so tests can check it)."""
    from flows.pipeline import pipeline_flow

    return pipeline_flow.to_deployment(
        name=DEPLOYMENT_NAME,
        cron=CRON,
        parameters={"params_file": params_file},
        description="Whole FedCache pipeline (partition, encode, index, ...) on params.yaml",
    )


def _wait_for(url: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(1)
    return False


def main() -> int:
    imports_done()  # flows/__init__.py paused the collector for `python -m` imports
    server = None
    if "PREFECT_API_URL" not in os.environ:
        api = f"http://{HOST}:{PORT}/api"
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(PORT)])
        if not _wait_for(f"{api}/health", 180):
            server.terminate()
            print("error: the local Prefect server did not start within 180 s", file=sys.stderr)
            return 1
        os.environ["PREFECT_API_URL"] = api
        print(f"Prefect UI: http://{HOST}:{PORT}")
    from prefect import serve

    try:
        serve(build_deployment())
    finally:
        if server is not None:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
