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


def imports_done() -> None:
    """Resume the collector paused above, what the imports made frozen first: it lives as long as the process, and
    every full collection would walk it again."""
    gc.freeze()
    gc.enable()
