"""Which methods exist, and each one's params section class, without any method's code.

A method is a folder, pipeline/methods/<name>/, holding method.py (its code: torch) and params.py (its
params.yaml section: pydantic). This module lists the folders and imports only a params.py when asked,
so pipeline/config.py (read by every stage) depends on no file under pipeline/methods/: editing a
method reruns only its own training stage, never the data stages (dvc.yaml; tests/test_dvc_deps.py).
pipeline/methods/registry.py adds the method classes for the training stages.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import MethodParams

METHODS_DIR = Path(__file__).resolve().parent / "methods"


@cache
def names() -> tuple[str, ...]:
    """Every method, sorted: the folders of pipeline/methods/ with a method.py and a params.py."""
    return tuple(sorted(d.name for d in METHODS_DIR.iterdir()
                        if d.is_dir() and (d / "method.py").is_file() and (d / "params.py").is_file()))


def only_class(module: ModuleType, is_one: Callable[[type], bool], what: str) -> type:
    """The one class of `module` (defined there) that `is_one` accepts; a TypeError naming the file otherwise."""
    found = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__ and is_one(v)]
    if len(found) != 1:
        listed = ", ".join(c.__name__ for c in found) or "none"
        raise TypeError(f"{module.__file__} must define exactly one {what}; it defines {listed}")
    return found[0]


def check_name(name: str) -> None:
    if name not in names():
        raise KeyError(f"unknown method {name!r}; the methods are {', '.join(names())} (folders of {METHODS_DIR})")


@cache
def params_class(name: str) -> type[MethodParams]:
    """The method's params section class, from pipeline/methods/<name>/params.py (no torch)."""
    check_name(name)
    # a MethodParams subclass (pipeline/config.py) is a pydantic model declaring what it `supports`;
    # told by that, so that config.py, which imports this module, is not imported back (and the
    # training core runs without pydantic: bench/gpu_check.sh)
    return only_class(importlib.import_module(f"pipeline.methods.{name}.params"),
                      lambda c: hasattr(c, "model_fields") and hasattr(c, "supports"),
                      "MethodParams subclass (the method's params.yaml section)")
