"""A training process's malloc arenas capped at one a core plus one (pipeline/train/engine.py, share_malloc_arenas):
with glibc's default (8 a core) a FedCache `step` round at paper scale, its lanes' worker threads allocating, kept
about 0.3 GiB more, over the 4 GiB bound (bench/scaling.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.train.engine import MALLOC_ARENAS, share_malloc_arenas

# threads (argv[1]) that each malloc while all are alive, then glibc's own report: one "Arena N:" block per arena in use
PROBE = """
import ctypes, sys, threading
import pipeline.train.engine  # sets the arenas at import
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
n = int(sys.argv[1])
alive = threading.Barrier(n)
def grab():
    for _ in range(100):
        libc.malloc(256)
    alive.wait()  # no thread ends (and hands its arena to the next) before every one has allocated
threads = [threading.Thread(target=grab) for _ in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()
"""


def test_the_environments_setting_is_left_to_glibc():
    assert MALLOC_ARENAS == ("MALLOC_ARENA_MAX", (os.cpu_count() or 1) + 1)  # a lane a core, and the main thread
    assert share_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is False  # glibc read it at the process's start


def arenas(repo_root, threads: int, **env) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env
    out = subprocess.run([sys.executable, "-c", PROBE, str(threads)], cwd=repo_root, env=environ,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return sum(line.startswith("Arena ") for line in out.stderr.splitlines())


@pytest.mark.slow  # two processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas: Linux only")
def test_threads_started_after_the_engine_is_imported_share_the_capped_arenas(repo_root):
    cap = MALLOC_ARENAS[1]
    assert arenas(repo_root, cap + 3) == cap  # more threads than arenas: they share
    # the environment's choice stands (and the probe sees an arena a thread where it may)
    assert arenas(repo_root, cap + 3, MALLOC_ARENA_MAX=str(cap + 8)) > cap
