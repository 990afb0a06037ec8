"""The methods, found by folder: pipeline/methods/<name>/ holding method.py and params.py is method <name>.

Adding a method is a new folder (and its params.yaml section); there is no list to edit. Nothing
here imports torch until a method's class is asked for: `names()` reads the folder, and
`params_class` imports only the method's params.py (pydantic), so the params schema and the data
stages never load method code.

    method.py   one `Method` subclass (the server half, with its `client_cls`) whose `name` is the folder's
    params.py   one `MethodParams` subclass: the method's params.yaml section
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import MethodParams
    from pipeline.federation.contract import Method

METHODS_DIR = Path(__file__).resolve().parent


@cache
def names() -> tuple[str, ...]:
    """Every method, sorted: the folders here with a method.py and a params.py."""
    return tuple(sorted(d.name for d in METHODS_DIR.iterdir()
                        if d.is_dir() and (d / "method.py").is_file() and (d / "params.py").is_file()))


def _only_class(module: ModuleType, is_one: Callable[[type], bool], what: str) -> type:
    found = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__ and is_one(v)]
    if len(found) != 1:
        listed = ", ".join(c.__name__ for c in found) or "none"
        raise TypeError(f"{module.__file__} must define exactly one {what}; it defines {listed}")
    return found[0]


def _check_name(name: str) -> None:
    if name not in names():
        raise KeyError(f"unknown method {name!r}; the methods are {', '.join(names())} (folders of {METHODS_DIR})")


@cache
def params_class(name: str) -> type[MethodParams]:
    """The method's params section class, from pipeline/methods/<name>/params.py (no torch)."""
    _check_name(name)
    # a MethodParams subclass (pipeline/config.py) is a pydantic model declaring homogeneous_only;
    # told by that, so that config.py, which imports this module, is not imported back (and the
    # training core runs without pydantic: bench/gpu_check.sh)
    return _only_class(importlib.import_module(f"pipeline.methods.{name}.params"),
                       lambda c: hasattr(c, "model_fields") and hasattr(c, "homogeneous_only"),
                       "MethodParams subclass (the method's params.yaml section)")


@cache
def method_class(name: str) -> type[Method]:
    """The method's server half, from pipeline/methods/<name>/method.py (imports torch)."""
    _check_name(name)
    # a Method subclass (pipeline/federation/contract.py) names itself; told by its declaration, so
    # the registry stays free of the training code the data stages never run
    return _only_class(importlib.import_module(f"pipeline.methods.{name}.method"),
                       lambda c: getattr(c, "name", None) == name and hasattr(c, "client_cls"),
                       f"Method subclass with name = {name!r}")


class _Registry(Mapping):
    """name -> Method class, importing a method's code only when it is looked up."""

    def __getitem__(self, name: str) -> type[Method]:
        return method_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())

    def __contains__(self, name: object) -> bool:
        return name in names()


REGISTRY = _Registry()
