"""Working directories for the benchmark scripts: bench/.work/<name>/ with its own params.yaml.

A script prepares one with `prepare_workspace` (the repo's params.yaml with its overrides, then
the stage CLIs it needs, run there as a pipeline run would), loads its inputs with
`load_workspace` and builds fresh Trainers over them in-process with `fresh_trainer`.

The scripts import it as `workspace` (they run as `python bench/<script>.py`, so bench/ is on
sys.path). Importing it puts the repo root first on sys.path for the pipeline imports. The
pipeline's own imports (torch and the rest) wait until they are needed, so the stage
subprocesses run before any of it is loaded.
"""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from pipeline.config import Params
    from pipeline.data.datasets import ImageDataset
    from pipeline.train.engine import Trainer
    from pipeline.data.partition import Partition


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: `base` with `overrides` merged in. Where both values are mappings they are
    merged key by key; any other override value (scalar, list, None) replaces the old one."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def prepare_workspace(name: str, overrides: Mapping[str, Any], stages: tuple[str, ...] = ("partition",),
                      *, verbose: bool = True) -> Path:
    """Prepare bench/.work/<name>/ (`name` may contain "/") and return its path.

    Writes its params.yaml (the repo's params.yaml with `overrides` deep-merged in: section ->
    {key: value}, or top-level key -> value), then runs each stage's CLI there in order
    (`python -m flows.<stage>` with PYTHONPATH the repo root, so Prefect included), stopping on
    the first failure. With `verbose`, prints each stage's wall time, in aligned columns when
    there is more than one stage.
    """
    work = ROOT / "bench" / ".work" / name
    work.mkdir(parents=True, exist_ok=True)
    params = deep_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), overrides)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    name_width = max(map(len, stages), default=0)
    time_width = 6 if len(stages) > 1 else 0
    for stage in stages:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", f"flows.{stage}"], cwd=work, env=env, check=True)
        if verbose:
            print(f"stage {stage:{name_width}s}: {time.perf_counter() - start:{time_width}.1f} s wall "
                  "(incl. Prefect start-up)", flush=True)
    return work


def load_workspace(work: Path) -> tuple[Params, Partition, ImageDataset]:
    """Change into `work` (the pipeline's output paths are relative to the working directory;
    this stays the current directory afterwards) and load its params.yaml, the partition the
    partition stage wrote there, and the dataset the params name."""
    os.chdir(work)
    from pipeline import paths
    from pipeline.config import load_params
    from pipeline.data.datasets import load_dataset
    from pipeline.data.partition import Partition

    params = load_params("params.yaml")
    return params, Partition.load(paths.PARTITION), load_dataset(params.data.dataset, params.data.root)


def fresh_trainer(params: Params, algorithm: str, part: Partition, ds: ImageDataset,
                  run_name: str | None = None, hetero: bool = False) -> Trainer:
    """A Trainer for `algorithm` (a pipeline.methods.registry.REGISTRY key) in the current workspace
    (see load_workspace), writing to results/runs/<run_name>/ and the workspace's results DuckDB.

    `run_name` defaults to the algorithm's name. Its checkpoint, results/checkpoints/<run_name>.pt,
    is deleted first, so the Trainer starts a new run instead of resuming. `hetero`: A1/A2/A3 by
    client index mod 3 (a hetero_algorithms run) instead of train.model on every client.
    """
    from pipeline import paths
    from pipeline.methods.registry import REGISTRY
    from pipeline.train.engine import Trainer
    from pipeline.results.store import ResultsDB

    run_name = run_name or algorithm
    ckpt = paths.CHECKPOINTS / f"{run_name}.pt"
    ckpt.unlink(missing_ok=True)
    return Trainer(params, REGISTRY[algorithm], part, ds, paths.RUNS / run_name, ckpt, ResultsDB(paths.RESULTS_DB),
                   [paths.PARTITION], hetero=hetero)


def print_seed_table(first_column: str, results: Mapping[str, list[dict]], n_seeds: int) -> None:
    """A Markdown table of run summaries grouped by variant: MAUA and final accuracy as mean +- std over
    the seeds (std with ddof 1; 0 for one seed) and the mean wall seconds (summary["wall_s"])."""
    def mean_std(values: list[float]) -> str:
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.4f} +- {std:.4f}"

    print(f"\n| {first_column} | MAUA (mean +- std, {n_seeds} seeds) | final accuracy | wall s per run |")
    print("|---|---|---|---|")
    for variant, runs in results.items():
        print(f"| {variant} | {mean_std([r['maua'] for r in runs])} | {mean_std([r['final_acc'] for r in runs])} "
              f"| {statistics.mean(r['wall_s'] for r in runs):.1f} |")
