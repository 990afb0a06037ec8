"""The folder shows the architecture, and the imports keep to it (read with `ast`, nothing run).

    pipeline/config.py, errors, paths, seeds, devices, progress, methods/registry.py   shared base
    data/         datasets, partition                    imports the base
    index/        encoder, hashes, neighbours, store     the base and data/
    federation/   contract, clients, ledger, losses      the base, data/, index/, models/
    methods/<m>/  one method each                        all of the above and models/, never another method
    results/      per-run store, compare, report, paper  the base
    train/        engine, executors, checkpoint          the base, data/, index/, federation/, results/
    experiments/  presets, sweeps, DVC experiments       the base and results/

No import cycles; config.py imports no torch code; methods/<m>/params.py imports no torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from test_dvc_deps import ROOT, imported_modules

BASE = {"pipeline", "pipeline.config", "pipeline.encoding_spec", "pipeline.errors", "pipeline.paths", "pipeline.seeds", "pipeline.torch_device",
        "pipeline.progress", "pipeline.method_catalog", "pipeline.capabilities", "pipeline.methods",
        "pipeline.methods.registry"}
ALLOWED = {
    "base": {"base"},
    "data": {"base", "data"},
    "index": {"base", "data", "index"},
    "federation": {"base", "data", "index", "federation", "models"},
    "methods": {"base", "data", "index", "federation", "methods", "models"},
    "results": {"base", "results"},
    "train": {"base", "data", "index", "federation", "results", "train", "models"},
    "experiments": {"base", "results", "experiments"},
    "models": {"models"},
    # the privacy audit of a finished run: reads what training kept (train.capture) and builds the method's models
    "audit": {"base", "data", "index", "federation", "methods", "models", "results", "train", "audit"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for folder in ("pipeline", "models"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            found[".".join(f.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")] = f
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The repo module an imported name refers to (`pipeline.index.store.create_cache` -> pipeline.index.store)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in MODULES:
            return ".".join(parts[:i])
    return None


def _graph() -> dict[str, set[str]]:
    return {name: {r for m in imported_modules(path) if (r := _resolve(m)) and r != name}
            for name, path in MODULES.items()}


def layer(module: str) -> str:
    if module in BASE:
        return "base"
    parts = module.split(".")
    return parts[0] if parts[0] == "models" else parts[1] if len(parts) > 2 else "base"


def _method_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "methods" else None


def test_every_pipeline_module_sits_in_a_known_layer():
    loose = [m for m in MODULES if m.startswith("pipeline.") and layer(m) not in ALLOWED]
    assert not loose, f"modules outside the layout (add them to a folder, or to BASE here): {loose}"
    top = sorted(p.name for p in (ROOT / "pipeline").iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "capabilities.py", "config.py", "encoding_spec.py", "errors.py", "machine.py",
                   "method_catalog.py", "paths.py", "progress.py", "seeds.py", "torch_device.py"]


def test_no_upward_imports():
    bad = [f"{a} -> {b}" for a, deps in _graph().items() for b in deps if layer(b) not in ALLOWED[layer(a)]]
    assert not bad, "imports against the layout:\n" + "\n".join(bad)


def test_a_method_imports_no_other_method():
    bad = [f"{a} -> {b}" for a, deps in _graph().items() for b in deps
           if _method_of(a) and _method_of(b) and _method_of(a) != _method_of(b)]
    assert not bad, "a method's folder must stand alone (shared code goes to federation/):\n" + \
        "\n".join(bad)


def test_no_import_cycles():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _names_from(path: Path, module: str) -> set[str]:
    """The names a file imports from `module` (`from module import a, b`)."""
    tree = ast.parse(path.read_text())
    return {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == module for a in n.names}


EXECUTORS = ["pipeline.train.executors", "pipeline.train.dask_executor", "models.grouped"]


@pytest.mark.parametrize("module", EXECUTORS)
def test_executors_never_see_the_server_half(module):
    """An executor gets the client half, the clients and the per-step hook: it cannot import `Server`."""
    assert "Server" not in _names_from(MODULES[module], "pipeline.federation.contract")


def _imports_torch(path: Path) -> bool:
    return any(m.split(".")[0] in ("torch", "torchvision") for m in imported_modules(path))


def test_config_and_every_params_module_import_no_torch_code():
    graph, todo, seen = _graph(), ["pipeline.config"], set()
    todo += [f"pipeline.methods.{p.parent.name}.params" for p in (ROOT / "pipeline/methods").glob("*/params.py")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not [m for m in seen if _imports_torch(MODULES[m])], "torch code reachable from the params schema"


def test_the_full_params_schema_loads_without_torch_or_method_code():
    """At run time too: validating every section of params.yaml imports no torch and no method.py."""
    code = ("import sys; from pipeline.config import load_params; load_params('params.yaml'); "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision') or m.endswith('.method')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_checks_can_fail():
    """The layer and cycle checks see a planted violation."""
    assert layer("pipeline.data.partition") == "data" and layer("pipeline.methods.fd.method") == "methods"
    assert "methods" not in ALLOWED["data"] and "train" not in ALLOWED["index"]
    assert _imports_torch(MODULES["pipeline.seeds"])
    tree = ast.parse("from pipeline.train.engine import Trainer")
    assert {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names} == {"Trainer"}
    assert _resolve("pipeline.train.engine.Trainer") == "pipeline.train.engine"
    assert "Server" in _names_from(MODULES["pipeline.train.engine"], "pipeline.federation.contract")
    assert _method_of("pipeline.methods.fedcache.knowledge") == "fedcache" and _method_of("pipeline.federation.gkt") is None


def test_shared_method_bases_live_in_the_shared_core():
    """pipeline/methods/ holds method folders and the registry only: a base more than one method builds on
    (parameter averaging, FedGKT's exchange) lives in pipeline/federation/, the core every training stage depends on."""
    loose = sorted(p.name for p in (ROOT / "pipeline/methods").glob("*.py") if p.name not in ("__init__.py", "registry.py"))
    assert not loose, f"shared code under pipeline/methods/ (move it to pipeline/federation/): {loose}"


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "pipeline/methods").iterdir()
                                         if p.is_dir() and p.name != "__pycache__"))
def test_a_method_folder_holds_a_method_and_its_params(name):
    from pipeline.methods import registry

    assert name in registry.names(), f"pipeline/methods/{name}/ lacks method.py or params.py"
    assert registry.params_class(name) and registry.method_class(name).name == name


def test_no_dashboard_module_is_over_400_lines():
    """The dashboard in small rooms (issue 37): one job per module, each a page or so a newcomer reads whole."""
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "dashboard").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"split these by job: {long}"


def test_the_dashboards_stage_facts_and_the_partition_load_no_torch():
    """The dashboard reads the partition with the pipeline's own loader (pipeline.data.partition, which draws its
    seeds from pipeline.seeds) instead of a copy of it: that code must stay torch-free (seconds of start-up)."""
    code = ("import sys; import dashboard.stages, pipeline.data.partition, pipeline.seeds; "
            "print([m for m in sys.modules if m.split('.')[0] == 'torch'][:3]); "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, f"torch loaded: {out.stdout} {out.stderr[-500:]}"
