"""Run a stage flow from the command line with a short error instead of a traceback for bad input."""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Callable

from prefect import Flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows import imports_done
from flows.api import ensure_api
from pipeline.config import load_params
from pipeline.errors import UserError

# Errors caused by the user's params or files: shown as one message, exit code 2.
USER_ERRORS = (UserError, FileNotFoundError)


def without_heartbeats():
    """Flow runs started inside send no Prefect heartbeats. Prefect joins a run's heartbeat thread for up to a
    second when the run ends (every subflow's too), and heartbeats only tell a server that watches a run alone
    (a worker's deployment run) that its process is alive: a stage run from the command line has a caller that
    sees it end, and the whole-pipeline flow's own heartbeats already speak for its subflows."""
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def run_stage(flow_fn: Callable[..., object], argv: list[str] | None = None, positional: tuple[str, ...] = (),
              flags: tuple[str, ...] = (), methods: Callable[[dict], tuple[str, ...]] = lambda args: ()) -> int:
    """Run a stage's flow from its command line; `methods(args)`: the method sections it reads."""
    imports_done()  # the stage module's imports are made (flows/__init__.py paused the collector for them)
    parser = argparse.ArgumentParser(description=flow_fn.__doc__)
    for name in positional:
        parser.add_argument(name)
    for name in flags:
        parser.add_argument(f"--{name}", action="store_true")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = vars(parser.parse_args(argv))
    params_file = args.pop("params")
    # Validate before Prefect starts: bad input fails in a second, before any work.
    try:
        load_params(params_file, methods(args))
        if isinstance(flow_fn, Flow):
            ensure_api()  # one Prefect server per `dvc repro`, gone when it is (flows/api.py)
        # What the imports made (torch, torch._dynamo, Prefect: millions of objects) lives as long as the process:
        # out of the cyclic garbage collector's sight, each full collection no longer walks it
        gc.freeze()
        with without_heartbeats():  # its caller (dvc, a shell) sees it end however it ends
            flow_fn(params_file=params_file, **args)
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        # the interpreter's shutdown runs full collections over the whole heap, a second or more of CPU at every
        # stage's end; frozen, they skip it (bench/levers.py's start-up table measures both exits)
        gc.freeze()
    return 0
