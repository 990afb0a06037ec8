"""Atomic round checkpoints: written to a temporary file, then renamed over the old one.

A checkpoint holds only what `torch.load(..., weights_only=True)` accepts: tensors, numbers,
strings, None and dicts/lists/tuples of them. Loading never runs code from the file, so a
checkpoint planted or swapped by someone else cannot execute anything. `save` converts the
engine's state into that form (numpy arrays become tensors tagged to come back as numpy
arrays, numpy scalars become Python numbers, defaultdicts plain dicts) and refuses anything
else by name; `load` converts it back.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NUMPY = "__numpy_array__"  # {_NUMPY: tensor}: a numpy array stored as a tensor
_PLAIN = (bool, int, float, str, bytes, type(None))


def _encode(obj: Any, where: str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, np.ndarray):
        try:
            return {_NUMPY: torch.from_numpy(np.ascontiguousarray(obj)).clone()}
        except TypeError:
            raise TypeError(f"checkpoint: cannot store {where}, a numpy array of dtype {obj.dtype}") from None
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):  # dict, defaultdict, OrderedDict (a model's state_dict)
        items = [(k, _encode(v, f"{where}[{k!r}]")) for k, v in obj.items()]
        for k, _ in items:
            if not isinstance(k, (*_PLAIN, tuple)):
                raise TypeError(f"checkpoint: cannot store {where}: key {k!r} of type {type(k).__name__}")
        if isinstance(obj, OrderedDict):
            out = OrderedDict(items)
            if hasattr(obj, "_metadata"):  # a state_dict's per-module versions
                out._metadata = obj._metadata  # type: ignore[attr-defined]
            return out
        return dict(items)
    if isinstance(obj, (list, tuple)):
        parts = [_encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return parts if isinstance(obj, list) else tuple(parts)
    raise TypeError(f"checkpoint: cannot store {where} of type {type(obj).__module__}.{type(obj).__qualname__}: "
                    "only tensors, numpy arrays, numbers, strings, None and dicts/lists/tuples of them")


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _NUMPY in obj:
            return obj[_NUMPY].numpy()
        out = type(obj)((k, _decode(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_decode(v) for v in obj)
    return obj


def save(path: Path, state: dict) -> None:
    path = Path(path)
    encoded = _encode(state, "state")  # before any write: a state it cannot hold leaves the old checkpoint alone
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(encoded, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous checkpoint intact


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read(path: Path, fix: str) -> dict:
    """A file `save` wrote (not a round checkpoint: e.g. the audit's sample of a run), decoded. A missing or
    unreadable file is an InputFileError naming it and `fix` (what writes it again)."""
    from pipeline.errors import InputFileError

    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path} not found; {fix}")
    try:
        return _decode(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as err:  # noqa: BLE001 - damaged, truncated or foreign: name the file and the fix
        raise InputFileError(f"{path} is unreadable ({type(err).__name__}: {_first_line(err)}); {fix}") from None


def load(path: Path) -> dict | None:
    """The checkpoint at `path`, or None (no file; or a file it will not use, with a warning saying why:
    the run then starts again from round 0 and overwrites it)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "weights only load failed" not in str(err).lower():  # not a refusal: a damaged file
            _warn(f"ignoring unreadable checkpoint {path} ({type(err).__name__}: {_first_line(err)}); starting this "
                  "run again from round 0 (its checkpoint will replace the file).")
            return None
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = next((line for line in lines if "Unsupported global" in line or "WeightsUnpickler" in line),
                      _first_line(err))
        _warn(f"refused checkpoint {path}: torch.load(weights_only=True) does not accept it ({reason}), so "
              "nothing in it was loaded or run: it holds objects other than tensors and plain data (written by "
              "an older version of the pipeline or by something else) or is damaged. Starting this run again "
              "from round 0 (its checkpoint will replace the file).")
        return None
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: start fresh, but say so
        _warn(f"ignoring unreadable checkpoint {path} ({type(err).__name__}: {_first_line(err)}); starting this "
              "run again from round 0 (its checkpoint will replace the file).")
        return None
    if not isinstance(state, dict) or not {"fingerprint", "round"} <= state.keys():
        _warn(f"ignoring {path}: not a round checkpoint of this pipeline; starting this run again from round 0.")
        return None
    return _decode(state)
