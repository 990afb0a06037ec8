"""Where each stage writes its outputs (all DVC outputs, never committed to git)."""

from pathlib import Path

PARTITION = Path("data/partition/partition.npz")
PARTITION_STATS = Path("data/partition/stats.json")
HASHES = Path("data/hashes/hashes.npy")
HASHES_INFO = Path("data/hashes/info.json")
RELATIONS = Path("data/cache/relations.npy")
CACHE_DIR = Path("data/cache")
RESULTS = Path("results")
RESULTS_DB = RESULTS / "results.duckdb"
RUNS = RESULTS / "runs"  # results/runs/<algorithm>/: summary.json (+ the run's cache DB copy)
CHECKPOINTS = RESULTS / "checkpoints"  # results/checkpoints/<algorithm>.pt (kept across dvc's output cleanup)
METRICS = RESULTS / "metrics.json"
REPORT_DIR = RESULTS / "report"


def run_name(algorithm: str, hetero: bool = False) -> str:
    return f"{algorithm}-hetero" if hetero else algorithm


def run_dir(algorithm: str, hetero: bool = False) -> Path:
    return RUNS / run_name(algorithm, hetero)


def checkpoint_path(algorithm: str, hetero: bool = False) -> Path:
    return CHECKPOINTS / f"{run_name(algorithm, hetero)}.pt"
