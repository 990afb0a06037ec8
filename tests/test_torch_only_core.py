"""The training core imports with torch and numpy alone.

bench/gpu_check.sh runs the executors on a bare GPU machine that has no Prefect, DVC, DuckDB,
pydantic, SQLAlchemy, faiss or networkx. This test imports the core in a fresh interpreter in
which those libraries cannot be imported, so a new top-level import of one of them fails here
and not on the GPU machine.
"""

import subprocess
import sys

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # a fresh interpreter (real processes: the end-to-end tier)

SERVICE_LIBRARIES = ["prefect", "dvc", "duckdb", "pydantic", "sqlalchemy", "faiss", "networkx", "yaml", "streamlit"]
CORE = ["pipeline.train.engine", "pipeline.train.executors", "models.grouped", "pipeline.methods.registry", "pipeline.data.datasets",
        "pipeline.data.partition", "pipeline.methods.fedcache.knowledge", "bench.torch_harness"]

BLOCKER = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('refused in this test: ' + name)
sys.meta_path.insert(0, Refuse())
import {modules}
print('ok')
"""


def test_core_imports_without_the_service_libraries():
    code = BLOCKER.format(blocked=set(SERVICE_LIBRARIES), modules=", ".join(CORE))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
