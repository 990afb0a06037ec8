"""Where the dashboard reads from: CLI args (after `--` of `streamlit run`), then env vars,
then the pipeline's default paths (relative to the working directory, the repo root under
`make dashboard`).

    FEDCACHE_RESULTS_DB        results index (DuckDB)         (default results/results.duckdb)
    FEDCACHE_RUNS_DIR          per-run results <dir>/*/run.duckdb (default: runs/ next to the index)
    FEDCACHE_PARTITION_DIR     partition.npz + stats.json     (default data/partition)
    FEDCACHE_CACHE_DB          knowledge cache SQLite file    (default: the run's index.db_url)
    FEDCACHE_DATA_ROOT         dataset root                   (default: the run's data.root)
    FEDCACHE_DASHBOARD_REFRESH seconds between auto-refreshes (default 5; 0 = off)
    FEDCACHE_DB_LOCK_TIMEOUT   seconds to retry a results DB locked by a writer (default 2)
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from pipeline import paths

ENV = {
    "results_db": "FEDCACHE_RESULTS_DB",
    "runs_dir": "FEDCACHE_RUNS_DIR",
    "partition_dir": "FEDCACHE_PARTITION_DIR",
    "cache_db": "FEDCACHE_CACHE_DB",
    "data_root": "FEDCACHE_DATA_ROOT",
    "refresh_s": "FEDCACHE_DASHBOARD_REFRESH",
    "lock_timeout_s": "FEDCACHE_DB_LOCK_TIMEOUT",
}


@dataclass(frozen=True)
class Config:
    results_db: Path
    partition_dir: Path
    cache_db: Path | None  # None: take it from the run's params (index.db_url)
    data_root: Path | None  # None: take it from the run's params (data.root)
    refresh_s: float
    lock_timeout_s: float = 2.0
    runs_dir: Path | None = None  # the per-run results files; None: <results_db dir>/runs

    @property
    def run_files_dir(self) -> Path:
        return self.runs_dir if self.runs_dir is not None else self.results_db.parent / paths.RUNS.name

    @property
    def stats_path(self) -> Path:
        return self.partition_dir / paths.PARTITION_STATS.name

    @property
    def partition_path(self) -> Path:
        return self.partition_dir / paths.PARTITION.name


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False and no positionals: under AppTest sys.argv is pytest's, which must pass through.
    p = argparse.ArgumentParser(prog="dashboard", allow_abbrev=False, add_help=False)
    p.add_argument("--results-db")
    p.add_argument("--runs-dir")
    p.add_argument("--partition-dir")
    p.add_argument("--cache-db")
    p.add_argument("--data-root")
    p.add_argument("--refresh", dest="refresh_s")
    p.add_argument("--lock-timeout", dest="lock_timeout_s")
    return p


def load_config(argv: list[str] | None = None, env: dict[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    args, _ = _parser().parse_known_args([] if argv is None else argv)

    def pick(name: str) -> str | None:
        return getattr(args, name) or env.get(ENV[name]) or None

    def seconds(name: str, default: float) -> float:
        try:
            return max(0.0, float(pick(name) or default))
        except ValueError:
            return default

    return Config(
        results_db=Path(pick("results_db") or paths.RESULTS_DB),
        partition_dir=Path(pick("partition_dir") or paths.PARTITION.parent),
        cache_db=Path(v) if (v := pick("cache_db")) else None,
        data_root=Path(v) if (v := pick("data_root")) else None,
        refresh_s=seconds("refresh_s", 5.0),
        lock_timeout_s=seconds("lock_timeout_s", 2.0),
        runs_dir=Path(v) if (v := pick("runs_dir")) else None,
    )
