"""What machine a figure came from, in words: every measured figure the project writes names its CPU."""

from __future__ import annotations

import functools
import os
import platform
import shlex
import sys
from pathlib import Path


def cpu_description() -> str:
    """E.g. "AMD EPYC (family 25, model 1; AVX2, no AVX-512), 2 CPUs": the model name, the family and model
    numbers that tell one generation from another where the name does not, and the vector extensions the
    speed and float results depend on."""
    fields = cpuinfo_fields()
    if not fields:  # no /proc/cpuinfo
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    flags = cpu_flags()
    vector = ("AVX-512" + (" with BF16" if "avx512_bf16" in flags else "") if "avx512f" in flags
              else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    if "amx_tile" in flags:
        vector += ", AMX"
    return (f"{fields.get('model name', platform.processor())} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}; {vector}), {os.cpu_count()} CPUs")


@functools.cache
def cpuinfo_fields() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is no such file)."""
    info = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    if info.exists():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (e.g. avx2, avx512_bf16, amx_bf16); empty where the
    system does not say."""
    return frozenset(cpuinfo_fields().get("flags", "").split())


# the CPU flags of native bfloat16 arithmetic: without them torch converts to float32 and back (emulated, slower)
BF16_UNITS = ("amx_bf16", "avx512_bf16")


def bf16_units(flags: set[str] | frozenset[str] | None = None) -> tuple[str, ...]:
    """The CPU's native bfloat16 instructions among `flags` (default: this CPU's), in BF16_UNITS' order."""
    flags = cpu_flags() if flags is None else flags
    return tuple(f for f in BF16_UNITS if f in flags)


# oneDNN's cap on the instructions it may use (oneDNN runs torch's CPU convolutions and matrix products): a value
# without AMX (e.g. AVX2, to mimic an older CPU) keeps AMX idle though the CPU has it
ONEDNN_ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def amx_in_use(flags: set[str] | frozenset[str] | None = None, environ: dict | None = None) -> bool:
    """Whether torch's kernels may run bfloat16 on AMX here: the CPU has it (`flags`, default this CPU's) and no
    oneDNN cap in `environ` (default the process's) holds them below it."""
    flags = cpu_flags() if flags is None else flags
    environ = os.environ if environ is None else environ
    cap = next((environ[v] for v in ONEDNN_ISA_VARS if environ.get(v)), "ALL").upper()
    return "amx_bf16" in flags and (cap in ("ALL", "DEFAULT") or "AMX" in cap)


# the packages a run's figures depend on (accuracy: torch's kernels; bytes and timing: the rest of the stack)
RECORDED_PACKAGES = ("torch", "torchvision", "numpy", "scipy", "faiss-cpu", "pydantic", "prefect", "dask", "dvc",
                     "duckdb", "sqlalchemy")


def run_environment() -> dict:
    """What a run records about where and how it ran (beside its params and git revision): the exact command,
    the working directory, Python, the recorded packages' versions (None: not installed), the platform and the CPU.
    The engine adds the torch threads and device it computed with."""
    return {"command": shlex.join(getattr(sys, "orig_argv", sys.argv)), "cwd": os.getcwd(),
            "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu_description(),
            "packages": dict(_package_versions())}


@functools.cache
def _package_versions() -> dict[str, str | None]:
    """The recorded packages' versions, looked up once per process: each lookup scans the installed distributions
    (about 25 ms for the list), and what a process imported does not change under it."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {name: version(name) for name in RECORDED_PACKAGES}
