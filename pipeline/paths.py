"""Where each stage writes its outputs (all DVC outputs, never committed to git)."""

from pathlib import Path

PARTITION = Path("data/partition/partition.npz")
PARTITION_STATS = Path("data/partition/stats.json")
HASHES = Path("data/hashes/hashes.npy")
HASHES_INFO = Path("data/hashes/info.json")
RELATIONS = Path("data/cache/relations.npy")
CACHE_DIR = Path("data/cache")
RESULTS = Path("results")
RESULTS_DB = RESULTS / "results.duckdb"  # the index of every run's rows, rebuilt from results/runs/*/run.duckdb
RUNS = RESULTS / "runs"  # results/runs/<algorithm>/: run.duckdb, summary.json (+ the run's cache DB copy)
RUN_RESULTS = "run.duckdb"  # a training stage's own rows, in its run directory
CHECKPOINTS = RESULTS / "checkpoints"  # results/checkpoints/<algorithm>.pt (kept across dvc's output cleanup)
AUDITS = RESULTS / "audit"  # results/audit/<name>/audit.json: each run's privacy audit (flows/audit.py)
METRICS = RESULTS / "metrics.json"
REPORT_DIR = RESULTS / "report"


def run_name(algorithm: str, hetero: bool = False) -> str:
    return f"{algorithm}-hetero" if hetero else algorithm


def run_dir(algorithm: str, hetero: bool = False) -> Path:
    return RUNS / run_name(algorithm, hetero)


def run_results(algorithm: str, hetero: bool = False) -> Path:
    return run_dir(algorithm, hetero) / RUN_RESULTS


def stage(algorithm: str, hetero: bool = False) -> str:
    """The DVC stage that writes this run: train@<algorithm> or train-hetero@<algorithm>."""
    return f"train-hetero@{algorithm}" if hetero else f"train@{algorithm}"


def stage_of_run(name: str) -> str:
    """The DVC stage of a run directory's name (see run_name)."""
    hetero = name.endswith("-hetero")
    return stage(name[: -len("-hetero")] if hetero else name, hetero)


def audit_stage_of_run(name: str) -> str:
    """The DVC stage that audits the run of this directory name: audit@<algorithm> or audit-hetero@<algorithm>."""
    return "audit" + stage_of_run(name).removeprefix("train")


def audit_file(algorithm: str, hetero: bool = False) -> Path:
    """The audit of a run (stage audit@<algorithm> or audit-hetero@<algorithm>)."""
    return audit_file_of_run(run_name(algorithm, hetero))


def audit_file_of_run(name: str) -> Path:
    """The audit of the run of this directory name (see run_name)."""
    return AUDITS / name / "audit.json"


def checkpoint_path(algorithm: str, hetero: bool = False) -> Path:
    return CHECKPOINTS / f"{run_name(algorithm, hetero)}.pt"
