"""DVC experiments: which one a stage runs in, the params it changed, and its runs in the main checkout.

`dvc exp run` tells the stages it runs which experiment they belong to: DVC_EXP_NAME (its name),
DVC_EXP_BASELINE_REV (the commit it started from) and DVC_ROOT (the main checkout; a queued
experiment runs in a temporary copy of it under .dvc/tmp/exps/). With them:

- a training stage records, in its run's row, the experiment's name and the params it changed
  (params that differ from the baseline commit's params.yaml, as dotted keys);
- the report stage of a queued experiment publishes the experiment's per-run files to the main
  checkout, results/experiments/<name>/<run>/, and rebuilds the main checkout's results index,
  so the dashboard shows the experiments of a sweep side by side with the workspace's runs.

Parallel experiments never share a file: each writes its own folder (each file copied under a
temporary name and renamed into place), and the index rebuilds are serialised by a file lock, so
the last rebuild sees every experiment published before it (pipeline.results.store.rebuild_index).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline import paths

EXPERIMENTS = paths.RESULTS / "experiments"  # results/experiments/<experiment>/<run>/run.duckdb


@dataclass(frozen=True)
class Experiment:
    name: str
    baseline_rev: str | None
    root: Path  # the main checkout


def current(env: dict[str, str] | None = None) -> Experiment | None:
    """The DVC experiment this process runs in (None outside `dvc exp run`)."""
    env = os.environ if env is None else env
    name = env.get("DVC_EXP_NAME")
    if not name:
        return None
    return Experiment(name, env.get("DVC_EXP_BASELINE_REV") or None, Path(env.get("DVC_ROOT") or ".").resolve())


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"train": {"rounds": 10}} -> {"train.rounds": 10} (lists and empty mappings stay values)."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def git_revision() -> str:
    """`git describe --always --dirty` of the working directory ("unknown" outside git)."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def baseline_params(exp: Experiment, params_file: str = "params.yaml"):
    """The baseline commit's params (validated, defaults filled in), or None when git cannot show them."""
    import yaml  # here: the training core imports this module without the service libraries

    from pipeline.config import ConfigError, parse_params

    if not exp.baseline_rev:
        return None
    shown = subprocess.run(["git", "-C", str(exp.root), "show", f"{exp.baseline_rev}:{params_file}"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    try:
        return parse_params(yaml.safe_load(shown.stdout), f"{params_file} at {exp.baseline_rev[:7]}")
    except (ConfigError, yaml.YAMLError):
        return None


def changed_params(params, exp: Experiment | None) -> dict[str, object] | None:
    """{dotted key: this run's value} for every param that differs from the experiment's baseline;
    None outside an experiment or when the baseline's params cannot be read."""
    if exp is None:
        return None
    base = baseline_params(exp)
    if base is None:
        return None
    dump = lambda p: flatten(p.model_dump(mode="json", by_alias=True))  # noqa: E731
    before, now = dump(base), dump(params)
    return {key: value for key, value in now.items() if before.get(key, object()) != value}


def _copy_atomic(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def publish(exp: Experiment, runs_dir: Path = paths.RUNS) -> list[Path]:
    """Copy this experiment's per-run files (run.duckdb, summary.json) into the main checkout's
    results/experiments/<name>/, then rebuild its index there. Returns the run folders written.

    Nothing to do (returns []) when the stage runs in the main checkout itself (`dvc exp run`
    without --queue/--temp): its runs are already in results/runs/."""
    from pipeline.results.store import rebuild_index, run_files

    if Path(runs_dir).resolve().parent.parent == exp.root:
        return []
    dest_root = exp.root / EXPERIMENTS / exp.name
    written = []
    for run_file in run_files(runs_dir):
        dest = dest_root / run_file.parent.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in (paths.RUN_RESULTS, "summary.json"):
            if (run_file.parent / name).is_file():
                _copy_atomic(run_file.parent / name, dest / name)
        written.append(dest)
    rebuild_index(exp.root / paths.RESULTS_DB, report_csv=exp.root / paths.REPORT_DIR / "comparison.csv")
    return written
