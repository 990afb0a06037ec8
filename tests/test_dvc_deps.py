"""DVC sees every dependency: each stage's `deps` cover every repo module its flow imports.

A stage's code is its flow module (from the stage's `cmd`, `./py -m flows.<name>`) and every
module of this repo that it imports, transitively: `pipeline.*`, `models.*`, `flows.*`, imports
inside functions included (they run when the stage does), imports under `if TYPE_CHECKING:`
left out (they never run). Importing `a.b.c` runs the `__init__.py` of `a` and `a.b` too; an
`__init__.py` that holds nothing but a docstring cannot change a result and is not required.
A folder dep (`pipeline/data`, `models`) covers every file below it.

A training stage (`foreach` over the methods) also runs its method's own code, which the registry
imports by name (pipeline/methods/<name>/method.py and params.py): its deps must cover that code
with `${item}` set to the method, and must not cover another method's folder, so that editing one
method reruns only its stage. The data stages read no method's or training code at all, nor any file
under pipeline/methods/ (pipeline/method_catalog.py lists the method folders for the params schema).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "models", "flows")


def _module_file(module: str) -> Path | None:
    """The file of a repo module (`pipeline.index.store` -> pipeline/index/store.py), or None."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@cache
def imported_modules(path: Path) -> set[str]:
    """Every module an `import` in this file names (at any depth), except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name == "__init__.py":
        package = package.removesuffix(".__init__")
    else:
        package = package.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from . import x / from .y import z
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            # `from pipeline import paths` imports the module pipeline.paths
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _with_parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _only_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
               for s in body)


@cache
def stage_code(flow_module: str) -> frozenset[str]:
    """Repo-relative paths of every file of this repo the flow module runs when imported."""
    todo, seen, files = [flow_module], set(), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _with_parents(module):
            path = _module_file(name)
            if path is None:
                continue
            if path.name == "__init__.py" and name != module and _only_docstring(path):
                continue  # a parent package's docstring-only __init__
            rel = path.relative_to(ROOT).as_posix()
            if rel not in files:
                files.add(rel)
                todo.extend(m for m in imported_modules(path) if m.split(".")[0] in PACKAGES)
    return frozenset(f for f in files if not (f.endswith("__init__.py") and _only_docstring(ROOT / f)))


@cache
def stages() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def stage_body(name: str) -> dict:
    """A stage's definition (a foreach stage's `do`)."""
    return stages()[name].get("do") or stages()[name]


def _flow_module(stage: dict) -> str:
    cmd = (stage.get("do") or stage)["cmd"]
    match = re.search(r"-m\s+(flows\.\w+)", cmd)
    assert match, f"stage command {cmd!r} does not run a flow module (python -m flows.<name>)"
    return match.group(1)


def _covered(path: str, deps: list[str]) -> bool:
    return any(path == d.rstrip("/") or path.startswith(d.rstrip("/") + "/") for d in deps)


def _method_names() -> list[str]:
    from pipeline.methods import registry

    return list(registry.names())


def _stage_instances() -> list[tuple[str, str | None]]:
    """(stage, method) for every stage; a foreach stage once per method (its ${item})."""
    return [(name, item) for name, stage in stages().items()
            for item in ((_method_names() if "foreach" in stage else [None]))]


def _deps(name: str, item: str | None) -> list[str]:
    body = stage_body(name)
    return [str(d).replace("${item}", item or "") for d in body["deps"]]


def _code(name: str, item: str | None) -> set[str]:
    code = set(stage_code(_flow_module(stages()[name])))
    if item is not None:  # the registry imports the method's modules by name
        code |= stage_code(f"pipeline.methods.{item}.method") | stage_code(f"pipeline.methods.{item}.params")
    return code


@pytest.mark.parametrize("name, item", _stage_instances())
def test_stage_deps_cover_every_module_its_flow_imports(name, item):
    missing = sorted(f for f in _code(name, item) if not _covered(f, _deps(name, item)))
    assert not missing, f"dvc.yaml stage {name!r} ({item}) runs code it does not list in deps: {missing}"


@pytest.mark.parametrize("name, item", _stage_instances())
def test_a_stage_depends_on_no_other_methods_code(name, item):
    """Editing one method's folder reruns that method's stage(s) only; the data stages and the
    report depend on no method's folder and (the data stages) on no training code."""
    other_methods = [m for m in _method_names() if m != item]
    for dep in _deps(name, item):
        for method in other_methods:
            folder = f"pipeline/methods/{method}"
            assert not _covered(folder + "/method.py", [dep]), f"stage {name!r} ({item}) lists {dep}, which covers {folder}"
    for method in other_methods:  # nor does its code import another method's
        assert not [f for f in _code(name, item) if f.startswith(f"pipeline/methods/{method}/")], \
            f"stage {name!r} ({item}) runs code of {method}"
    if name in ("partition", "encode", "index"):  # no file under pipeline/methods/: not even the registry
        assert not [d for d in _deps(name, item)
                    if d.startswith(("pipeline/train", "pipeline/federation", "pipeline/methods", "models"))]
        assert not [f for f in _code(name, item) if f.startswith(("pipeline/methods/", "pipeline/train/"))]


@pytest.mark.parametrize("name, item", _stage_instances())
def test_every_code_dep_exists(name, item):
    for dep in _deps(name, item):
        if dep.startswith(PACKAGES):  # code; data deps are other stages' outputs
            assert (ROOT / dep).exists(), f"dvc.yaml stage {name!r} ({item}) lists {dep}, which does not exist"


def test_the_import_walk_finds_what_it_should():
    """The walk itself: function-level imports, `from package import module`, parents' __init__."""
    code = stage_code("flows.train")
    assert {"flows/__init__.py", "flows/train.py", "pipeline/train/engine.py", "pipeline/paths.py",
            "models/grouped.py",  # imported inside a function of executors.py
            "pipeline/methods/registry.py", "models/multiexit.py"} <= code
    # `from pipeline.index import store` inside fedcache's methods
    assert "pipeline/index/store.py" in stage_code("pipeline.methods.fedcache.method")
    assert "pipeline/__init__.py" not in code  # a docstring only
    # `if __name__ == "__main__": from flows.cli import run_stage` runs when the stage runs
    assert {"flows/cli.py", "pipeline/errors.py"} <= stage_code("flows.partition")
