"""The methods, found by folder: pipeline/methods/<name>/ holding method.py and params.py is method <name>.

Adding a method is a new folder (and its params.yaml section); there is no list to edit. Nothing
here imports torch until a method's class is asked for: `names()` and `params_class` are
pipeline/method_catalog.py's (the folders; a method's params.py, pydantic), which the params schema
and the data stages read without this module.

    method.py   one `Server` subclass (the server half, with its `client_cls`) whose `name` is the folder's
    params.py   one `MethodParams` subclass: the method's params.yaml section
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING

from pipeline import method_catalog

if TYPE_CHECKING:
    from pipeline.federation.contract import Server

# which methods exist and their params classes: the catalog (no method code; the data stages read it)
names, params_class, METHODS_DIR = method_catalog.names, method_catalog.params_class, method_catalog.METHODS_DIR


@cache
def method_class(name: str) -> type[Server]:
    """The method's server half, from pipeline/methods/<name>/method.py (imports torch)."""
    method_catalog.check_name(name)
    # a Server subclass (pipeline/federation/contract.py) names itself; told by its declaration, so
    # the registry stays free of the training code the data stages never run
    return method_catalog.only_class(importlib.import_module(f"pipeline.methods.{name}.method"),
                                     lambda c: getattr(c, "name", None) == name and hasattr(c, "client_cls"),
                                     f"Server subclass with name = {name!r}")


class _Registry(Mapping):
    """name -> Server class, importing a method's code only when it is looked up."""

    def __getitem__(self, name: str) -> type[Server]:
        return method_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())

    def __contains__(self, name: object) -> bool:
        return name in names()


REGISTRY = _Registry()
