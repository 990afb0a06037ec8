"""Prefect flows: one per pipeline stage, plus the whole pipeline and its deployment.

Importing this package sets offline-safe defaults before Prefect is imported, so
`dvc repro` works the same whether or not it was started through `make`; in a program started
as `python -m flows.<module>` it also pauses the garbage collector until the program's imports
are made (below).
"""

import gc
import os
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for key, value in {
    "PREFECT_HOME": str(_ROOT / ".prefect"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    # the ephemeral API server takes longer than the 20 s default to start on a loaded 2-core machine
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "DVC_NO_ANALYTICS": "1",
}.items():
    os.environ.setdefault(key, value)

# A program started as `python -m flows.<module>` (a stage, the API server, serve, deploy, summary) spends its first
# seconds importing torch and Prefect, and the cyclic garbage collector's passes over those objects while they were
# created took about a sixth of that (bench/levers.py's start-up table). Python sets sys.argv[0] to "-m" while it
# locates the module, so this package knows it is being started that way; the program calls `imports_done()` once its
# imports are made. Anything else that imports flows (tests, workers, the dashboard) keeps its collector as it is.
if sys.argv[:1] == ["-m"]:
    gc.disable()

# The pipeline's stages (dvc.yaml runs each as `./py -m flows.<stage>`), whose Prefect server (flows/api.py) starts
# now, beside the stage's own imports, instead of after them.
STAGES = ("partition", "encode", "index", "train", "audit", "report")


def stage_of(argv: list[str]) -> str | None:
    """The stage a command line starts (`python [options] -m flows.<stage> ...`), else None."""
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    stage = module.removeprefix("flows.")
    return stage if module.startswith("flows.") and stage in STAGES else None


def _started_stage() -> str | None:
    """The stage this process was started as, from its command line (/proc); None elsewhere than Linux, where the
    server starts once the stage has made its imports, as it did before."""
    try:
        return stage_of(Path("/proc/self/cmdline").read_bytes().decode(errors="replace").split("\0"))
    except OSError:
        return None


def imports_done() -> None:
    """Resume the collector paused above, what the imports made frozen first: it lives as long as the process, and
    every full collection would walk it again."""
    gc.freeze()
    gc.enable()


if sys.argv[:1] == ["-m"] and _started_stage():
    from flows.api import start_early

    start_early()
