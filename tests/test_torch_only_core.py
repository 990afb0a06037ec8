"""The training core imports with torch and numpy alone.

bench/gpu_check.sh runs the executors on a bare GPU machine that has no Prefect, DVC, DuckDB,
pydantic, SQLAlchemy, faiss or networkx. This test imports the core in a fresh interpreter in
which those libraries cannot be imported, so a new top-level import of one of them fails here
and not on the GPU machine.
"""

import subprocess
import sys

import pytest

from bench import roofline
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # a fresh interpreter (real processes: the end-to-end tier)

SERVICE_LIBRARIES = ["prefect", "dvc", "duckdb", "pydantic", "sqlalchemy", "faiss", "networkx", "yaml", "streamlit"]
CORE = ["pipeline.train.engine", "pipeline.train.executors", "models.grouped", "pipeline.methods.registry", "pipeline.data.datasets",
        "pipeline.data.partition", "pipeline.methods.fedcache.knowledge", "bench.torch_harness"]

# The service libraries as absent as on the GPU machine: importing one fails with ModuleNotFoundError, and
# importlib.util.find_spec finds no file for it (torch._dynamo, imported by the first optimizer, probes some of
# them that way).
ABSENT = """
import importlib.abc, importlib.machinery, sys
class Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        raise ModuleNotFoundError('refused in this test: ' + module.__name__, name=module.__name__)
sys.meta_path.insert(0, Absent())
"""
BLOCKER = ABSENT + """
import {modules}
print('ok')
"""


def test_core_imports_without_the_service_libraries():
    code = BLOCKER.format(blocked=set(SERVICE_LIBRARIES), modules=", ".join(CORE))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


RUN_SCRIPT = ABSENT + """
import runpy
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_the_gpu_checks_roofline_runs_with_torch_and_numpy_alone(tmp_path):
    """bench/gpu_check.sh's second part, on this CPU: bench/roofline.py --harness builds its rounds without a stage
    or a service library and writes the roofline tables for both executors."""
    out = tmp_path / "roofline.md"
    argv = ["bench/roofline.py", "--harness", "--quick", "--synthetic", "--precisions", "fp32", "--rounds", "1",
            "--warmup", "0", "--threads", "1", "--out", str(out)]
    code = RUN_SCRIPT.format(blocked=set(SERVICE_LIBRARIES), argv=argv)
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    table = out.read_text()
    assert table.startswith("# Roofline: FedCache rounds against the CPU's peak")
    assert f"| quick: {roofline.DESCRIPTIONS['quick']} | 4 |" in table
    for executor in ("sequential", "vectorized"):
        row = next(line for line in table.splitlines() if line.startswith(f"| quick | {executor} | fp32 | 1 |"))
        fraction = float(row.split("|")[10].strip().rstrip("%"))
        assert 0 < fraction <= 100, row
        assert any(line.startswith(f"| quick | {executor} | fp32 |") and line.count("%") == 8
                   for line in table.split("## Where the time goes")[1].splitlines()), executor
