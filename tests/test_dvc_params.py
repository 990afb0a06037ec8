"""DVC reruns a stage when a param it reads changes: every params key a stage's code reads is in
its `params:` in dvc.yaml (or reaches it through an upstream stage's output it depends on).

Each stage's flow runs here in-process on the tiny MNIST setting, as `dvc repro` would run it,
with its params wrapped in a recorder that notes every key the code reads (`train.lr`,
`fedcache.T`). Prefect is left out (each task runs as the plain function it wraps), so no server
is needed. Reading the whole params to record them with the run (`model_dump`: the run's own
record of its config, shown by the dashboard) is not counted as reading each key.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from conftest import tiny_params_raw
from pipeline.methods import registry
from test_dvc_deps import stage_body, stages

pytestmark = pytest.mark.slow  # each stage's flow run whole (partition to audit): the end-to-end tier


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py), a quarter of the convolution:
    these runs record which params keys a stage reads, not what it learns."""
    return small_mnist


# Keys a training stage reads that cannot change its results, so changing them must not retrain:
# how the work is spread (equal results: tests/test_executors.py, tests/test_dask_executor.py) and
# how often it is saved (tests/test_resume.py), and which stages exist (DVC's foreach itself).
NOT_RESULTS = {
    "train.threads": "torch's thread count",
    "train.checkpoint_every": "how often a checkpoint is written",
    "train.dask_address": "where the dask executor's workers run",
    "train.dask_workers": "how many dask workers a local cluster has",
    "train.algorithms": "which training stages exist (the foreach list)",
    "train.hetero_algorithms": "which heterogeneous stages exist (the foreach list)",
}


class Recorded:
    """A params model (or one of its sections) that notes every field read, as a dotted key."""

    def __init__(self, model: BaseModel, reads: set[str], prefix: str = ""):
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_reads", reads)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        model, fields = self._model, type(self._model).model_fields
        prop = getattr(type(model), name, None)
        if isinstance(prop, property):  # e.g. cache_db_path: what it reads is recorded as it reads it
            return prop.fget(self)
        value = getattr(model, name)
        if name not in fields:  # model_dump, class attributes and the rest
            return value
        key = self._prefix + (fields[name].alias or name)
        if isinstance(value, BaseModel):
            return Recorded(value, self._reads, key + ".")
        self._reads.add(key)
        return value


def _plain_tasks(monkeypatch, module) -> None:
    """Each Prefect task of a flow module replaced by the function it wraps (no server)."""
    from prefect import Task

    for name, value in vars(module).items():
        if isinstance(value, Task):
            monkeypatch.setattr(module, name, value.fn)


def _run_stage(monkeypatch, flow_module: str, *args, methods=()) -> set[str]:
    from pipeline.config import load_params

    module = importlib.import_module(flow_module)
    _plain_tasks(monkeypatch, module)
    reads: set[str] = set()
    monkeypatch.setattr(module, "load_params",
                        lambda path, methods=methods: Recorded(load_params(path, methods), reads))
    flow = next(v for k, v in vars(module).items() if k.endswith("_flow"))
    flow.fn(*args, params_file="params.yaml")
    return reads


def _params_reaching(stage: str, item: str | None) -> list[str]:
    """The stage's own params, and those of every stage upstream of it (through the outputs it depends on)."""
    keys = [str(k).replace("${item}", item or "") for k in stage_body(stage).get("params", [])]
    deps = {str(d) for d in stage_body(stage)["deps"]}
    for other in stages():
        outs = {str(next(iter(o))) if isinstance(o, dict) else str(o) for o in stage_body(other).get("outs", [])}
        if other != stage and outs & deps:
            keys += _params_reaching(other, None)
    return keys


def _missing(reads: set[str], stage: str, item: str | None = None, exempt=()) -> list[str]:
    covered = _params_reaching(stage, item)
    return sorted(k for k in reads if k not in exempt
                  and not any(k == c or k.startswith(c + ".") for c in covered))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, mnist):
    """The tiny setting's params.yaml in a folder of its own, every method's section at its default."""
    return tmp_path_factory.mktemp("params-read")


def _in(workspace: Path, monkeypatch, overrides: dict | None = None) -> None:
    monkeypatch.chdir(workspace)
    (workspace / "params.yaml").write_text(yaml.safe_dump(tiny_params_raw(overrides), sort_keys=False))


def test_the_data_stages_and_the_report_read_only_their_params(workspace, monkeypatch, mnist):
    _in(workspace, monkeypatch)
    for stage in ("partition", "encode", "index"):
        reads = _run_stage(monkeypatch, f"flows.{stage}")
        assert reads, f"the {stage} stage read no params: the recorder saw nothing"
        assert not _missing(reads, stage), f"dvc.yaml stage {stage!r} reads params it does not list: " \
                                           f"{_missing(reads, stage)}"


@pytest.mark.parametrize("method", registry.names())
def test_a_training_stage_reads_only_its_params(workspace, monkeypatch, mnist, method):
    _in(workspace, monkeypatch, {"train": {"rounds": 1, "algorithms": [method], "threads": 1},
                                 method: registry.params_class(method).tiny_setting})
    for stage in ("partition", "encode", "index"):  # this workspace's inputs, as dvc repro builds them
        if not (workspace / "data/cache").exists():
            _run_stage(monkeypatch, f"flows.{stage}")
    reads = _run_stage(monkeypatch, "flows.train", method, methods=(method,))
    assert "train.lr" in reads and "seed" in reads
    missing = _missing(reads, "train", method, exempt=NOT_RESULTS)
    assert not missing, f"train@{method} reads params dvc.yaml does not list in its params: {missing}"


@pytest.mark.parametrize("method", ["fedavg", "fedcache"])
def test_an_async_training_stage_reads_only_its_params(workspace, monkeypatch, mnist, method):
    """Under train.schedule async (pipeline/train/schedules/async_.py), which reads the async_* keys and FedAsync's."""
    _in(workspace, monkeypatch, {"train": {"rounds": 1, "algorithms": [method], "threads": 1, "schedule": "async"},
                                 "devices": {"enabled": True}, method: registry.params_class(method).tiny_setting})
    for stage in ("partition", "encode", "index"):
        if not (workspace / "data/cache").exists():
            _run_stage(monkeypatch, f"flows.{stage}")
    reads = _run_stage(monkeypatch, "flows.train", method, methods=(method,))
    assert "train.async_eval_s" in reads and "devices.samples_per_s" in reads
    assert method != "fedavg" or "train.async_alpha" in reads
    missing = _missing(reads, "train", method, exempt=NOT_RESULTS)
    assert not missing, f"async train@{method} reads params dvc.yaml does not list in its params: {missing}"


@pytest.mark.parametrize("method", ["fedcache", "fedavg"])
def test_the_audit_stage_reads_only_its_params(workspace, monkeypatch, mnist, method):
    _in(workspace, monkeypatch, {"train": {"rounds": 1, "algorithms": [method], "threads": 1},
                                 method: registry.params_class(method).tiny_setting})  # the tiny audit budgets
    for stage in ("partition", "encode", "index"):
        if not (workspace / "data/cache").exists():
            _run_stage(monkeypatch, f"flows.{stage}")
    _run_stage(monkeypatch, "flows.train", method, methods=(method,))
    reads = _run_stage(monkeypatch, "flows.audit", method, methods=(method,))
    assert "audit.members" in reads and "seed" in reads
    missing = _missing(reads, "audit", method)
    assert not missing, f"audit@{method} reads params dvc.yaml does not list in its params: {missing}"


def test_the_report_reads_only_its_params(workspace, monkeypatch, mnist):
    _in(workspace, monkeypatch, {"train": {"rounds": 1, "algorithms": ["local"], "threads": 1}})
    for stage in ("partition", "encode", "index"):
        if not (workspace / "data/cache").exists():
            _run_stage(monkeypatch, f"flows.{stage}")
    _run_stage(monkeypatch, "flows.train", "local", methods=("local",))
    reads = _run_stage(monkeypatch, "flows.report")
    assert "report.baseline" in reads
    assert not _missing(reads, "report"), f"the report reads params it does not list: {_missing(reads, 'report')}"


def test_the_recorder_sees_a_key_dvc_yaml_leaves_out():
    """The check can fail: a read of a key no stage lists is reported."""
    assert _missing({"train.lr", "train.no_such_key"}, "train", "fd") == ["train.no_such_key"]
