"""Atomic round checkpoints: written to a temporary file, then renamed over the old one."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save(path: Path, state: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous checkpoint intact


def load(path: Path) -> dict | None:
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file: start fresh, but say so
        print(f"warning: ignoring unreadable checkpoint {path} ({type(err).__name__}: {err})")
        return None
