"""Prefect flows: one per pipeline stage, plus the whole pipeline and its deployment.

Importing this package sets offline-safe defaults before Prefect is imported, so
`dvc repro` works the same whether or not it was started through `make`.
"""

import os
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
