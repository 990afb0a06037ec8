"""What machine a figure came from, in words: every measured figure the project writes names its CPU."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_description() -> str:
    """E.g. "AMD EPYC (family 25, model 1; AVX2, no AVX-512), 2 CPUs": the model name, the family and model
    numbers that tell one generation from another where the name does not, and the vector extensions the
    speed and float results depend on."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    fields: dict[str, str] = {}
    for line in info.read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    vector = ("AVX-512" + (" with BF16" if "avx512_bf16" in flags else "") if "avx512f" in flags
              else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    if "amx_tile" in flags:
        vector += ", AMX"
    return (f"{fields.get('model name', platform.processor())} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}; {vector}), {os.cpu_count()} CPUs")
