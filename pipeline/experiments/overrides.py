"""A preset's or a sweep's params overrides: set as dotted keys on a params mapping, written as the `-S`
flags `dvc exp run` reads back, and the dvc program that runs them (shared by presets.py and sweeps.py)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from pathlib import Path

from pipeline.config import ConfigError

SIMPLE = re.compile(r"[A-Za-z0-9_./:+-]+")  # a string DVC's -S (Hydra's grammar) reads without quotes


def apply(base: dict, flat: dict[str, object], source: str) -> dict:
    """A copy of the params mapping `base` with the dotted keys set (as `dvc exp run -S` does)."""
    out = copy.deepcopy(base)
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for i, part in enumerate(parents):
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"{source}: {dotted}: params.yaml has no section {'.'.join(parents[:i + 1])!r}")
            node = node[part]
        node[leaf] = value
    return out


def flag_value(value: object) -> str:
    """A value as DVC's -S reads it back (YAML-like: null, true, 1.5, [a,b], "quoted text")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):  # 1e-05 -> 1.0e-05: YAML 1.1 readers take an exponent without a dot as text
        text = repr(value)
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    if isinstance(value, list):
        return "[" + ",".join(flag_value(v) for v in value) + "]"
    text = str(value)
    return text if SIMPLE.fullmatch(text) and text not in ("null", "true", "false") else json.dumps(text)


def flags(flat: dict[str, object]) -> list[str]:
    return [f"{key}={flag_value(value)}" for key, value in flat.items()]


def dvc_program() -> str:
    """This interpreter's dvc (the venv's) when it has one, else the one on PATH."""
    local = Path(sys.executable).parent / "dvc"
    return str(local) if local.exists() else (shutil.which("dvc") or "dvc")


def first_comment(path: Path) -> str:
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""
