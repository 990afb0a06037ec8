"""Did a change move the results? Two built checkouts compared, method by method.

    .venv/bin/python bench/same_results.py BEFORE AFTER

BEFORE and AFTER are checkouts where `dvc repro` ran (e.g. `bench/make_run.py --keep DIR` at two
commits). Prints, per training stage, whether the ledgers are byte-identical (every comm row:
round, client, direction, kind, bytes, peer) and whether the per-round and per-client accuracies
are equal, then whether results/metrics.json is the same apart from run ids and timings. Exits 1
when anything differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import duckdb

VOLATILE = {"run_id", "seconds", "started_at", "finished_at", "wall_s", "wall_seconds"}


def _rows(run_file: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(run_file), read_only=True) as con:
        return con.execute(sql).fetchall()


def run_tables(run_file: Path) -> dict[str, list[tuple]]:
    return {
        "ledger": _rows(run_file, "SELECT round, client_id, direction, kind, bytes, peer_id FROM comm ORDER BY ALL"),
        "rounds": _rows(run_file, "SELECT round, mean_acc, bytes_up, bytes_down FROM rounds ORDER BY round"),
        "clients": _rows(run_file, "SELECT round, client_id, acc FROM client_rounds ORDER BY round, client_id"),
    }


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    same = True
    runs = sorted(p.parent.name for p in (args.before / "results/runs").glob("*/run.duckdb"))
    after_runs = sorted(p.parent.name for p in (args.after / "results/runs").glob("*/run.duckdb"))
    if runs != after_runs:
        print(f"different stages: {runs} vs {after_runs}")
        same = False
    for name in runs:
        if name not in after_runs:
            continue
        a = run_tables(args.before / "results/runs" / name / "run.duckdb")
        b = run_tables(args.after / "results/runs" / name / "run.duckdb")
        verdict = {table: a[table] == b[table] for table in a}
        total = sum(r[4] for r in a["ledger"])
        print(f"{name:10s} ledger rows {len(a['ledger']):6d} ({total:,} bytes): "
              + ", ".join(f"{t} {'identical' if ok else 'DIFFERENT'}" for t, ok in verdict.items()))
        same &= all(verdict.values())
    ma = _strip(json.loads((args.before / "results/metrics.json").read_text()))
    mb = _strip(json.loads((args.after / "results/metrics.json").read_text()))
    print(f"results/metrics.json (run ids and timings aside): {'identical' if ma == mb else 'DIFFERENT'}")
    same &= ma == mb
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
