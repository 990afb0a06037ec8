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


def run_dir(algorithm: str) -> Path:
    return RUNS / algorithm


def checkpoint_path(algorithm: str) -> Path:
    return CHECKPOINTS / f"{algorithm}.pt"
