"""`train.precision`: the arithmetic of local training's forward passes and of evaluation.

  float32    the reference: no autocast at all (the equivalence tests and
             bench/method_fingerprint.py run it).
  bfloat16   each local step's forward + loss, and every evaluation, under torch.autocast(bfloat16):
             convolutions and matrix products run in bfloat16 (what autocast keeps in float32, such
             as cross-entropy, stays there). It pays only where the hardware has bfloat16 units
             (CPUs with avx512_bf16 or AMX, recent GPUs); elsewhere the bfloat16 kernels are
             emulated and slower than float32.
  auto       the default: bfloat16 where it was measured to win and to tie on accuracy (a CPU with
             AMX: docs/executors.md's levers, docs/choices.md), float32 everywhere else (CPUs without
             AMX, or with oneDNN capped below it by ONEDNN_MAX_CPU_ISA, where bfloat16 is emulated or
             unmeasured, and GPUs until bench/gpu_check.sh has
             measured one). A run records what it resolved to (its environment's `precision`).

What autocast does not touch stays float32: weights, BatchNorm statistics, gradients and optimizer
state (the backward pass and the optimizer step run outside the autocast block, as torch advises),
and whatever leaves a step (recorded rows, per-step exchange payloads) is cast back to float32 here, so
uploads, the byte ledger and the wire formulas do not depend on the precision. A method's own
`begin` / `end` work (e.g. a forward pass over its samples to build an upload) and the server half,
per-step exchange included, run in float32.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch

from pipeline.machine import amx_in_use

if TYPE_CHECKING:  # the training core runs without the config library (bench/gpu_check.sh)
    from pipeline.config import Params

_REDUCED = (torch.bfloat16, torch.float16)


def resolved_precision(precision: str, device: torch.device | str) -> str:
    """"float32" or "bfloat16": what `train.precision` means on `device` ("auto" decided by the hardware)."""
    if precision != "auto":
        return precision
    return "bfloat16" if torch.device(device).type == "cpu" and _cpu_has_amx_bf16() else "float32"


@functools.cache
def _cpu_has_amx_bf16() -> bool:
    return amx_in_use()  # (not where oneDNN is capped below AMX: bfloat16 would be emulated there)


def autocast_for(params: Params, device: torch.device | str) -> AbstractContextManager:
    """The block's forward + loss in the run's precision on `device` (float32: no autocast at all, so the
    reference path runs exactly the code it ran before the knob existed)."""
    if resolved_precision(params.train.precision, device) == "float32":
        return nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def autocast_off(device: torch.device | str) -> AbstractContextManager:
    """Autocast paused for a block inside a step (the server half's per-step exchange computes in float32);
    nothing at all where autocast is not on."""
    kind = torch.device(device).type
    return torch.autocast(device_type=kind, enabled=False) if torch.is_autocast_enabled(kind) else nullcontext()


def as_float32(t: torch.Tensor) -> torch.Tensor:
    """A reduced-precision float tensor as float32; anything else (float32 itself, float64 in equivalence
    tests, integer ids and codes) as it is, the same tensor object."""
    return t.float() if t.dtype in _REDUCED else t
