"""Where `make run`'s time goes: each stage's wall time, and for a training stage its parts.

    .venv/bin/python bench/make_run.py [--keep DIR] [-S key=value ...]

Runs `make run` in a fresh copy of the working tree (as git would clone it, with this checkout's
.venv linked in: the set-up is done, every stage runs, data stages included) on params.yaml (with
the `-S` overrides), and prints, per stage, the wall time between DVC's "Running stage" lines, and
for a training stage the parts its summary.json records: the process's start (interpreter, imports,
the Prefect server), loading the data and building the clients, the rounds (set-up round included),
and within them evaluation, results writes, checkpoints and the exchange. Run it on an otherwise
idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def fresh_copy(dest: Path) -> Path:
    """The working tree as git would clone it (tracked and untracked-not-ignored files), .venv linked."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in files:
        if rel and (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    (dest / ".git/info/exclude").write_text(".venv\n")
    return dest


def override(params_file: Path, flags: list[str]) -> None:
    raw = yaml.safe_load(params_file.read_text())
    for flag in flags:
        key, value = flag.split("=", 1)
        *parents, leaf = key.split(".")
        node = raw
        for p in parents:
            node = node[p]
        node[leaf] = yaml.safe_load(value)
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="run in this (new) directory and keep it")
    parser.add_argument("-S", dest="overrides", action="append", default=[], help="key=value on params.yaml")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="make_run-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = fresh_copy(work)
    if args.overrides:
        override(repo / "params.yaml", args.overrides)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(work)), "LANG": "C.UTF-8",
           "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    marks: list[tuple[str, float]] = []  # (stage, when it started)
    proc = subprocess.Popen(["make", "run"], cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    for line in proc.stdout:
        sys.stdout.write(line)
        m = re.match(r"Running stage '([^']+)'", line)
        if m:
            marks.append((m.group(1), time.monotonic() - start))
        elif line.startswith("== pipeline summary"):
            marks.append(("summary", time.monotonic() - start))
    total = time.monotonic() - start
    if proc.wait() != 0:
        print(f"make run failed ({proc.returncode})", file=sys.stderr)
        return 1
    ends = [t for _, t in marks[1:]] + [total]
    print(f"\nmake run: {total:.0f} s in all ({total / 60:.1f} min); copy in {repo}")
    cols = ["startup", "prepare", "rounds", "eval", "db", "checkpoint", "exchange"]
    print(f"{'stage':24s} {'wall s':>7s} " + " ".join(f"{c:>10s}" for c in cols))
    for (stage, began), end in zip(marks, ends):
        parts = {}
        m = re.fullmatch(r"train(-hetero)?@(\w+)", stage)
        if m:
            summary = repo / "results" / "runs" / (m.group(2) + (m.group(1) or "")) / "summary.json"
            parts = json.loads(summary.read_text()).get("seconds", {})
        print(f"{stage:24s} {end - began:7.1f} " + " ".join(f"{parts[c]:10.1f}" if c in parts else f"{'':>10s}"
                                                           for c in cols))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
