"""Results in one DuckDB file (results/results.duckdb): runs, rounds, client_rounds, comm.

The trainer opens the file only for the moment of a write (one transaction per round) and
closes it again, so another process (the dashboard) can open it between writes. A writer
that finds the file locked by a reader retries for a while before giving up.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb

DEFAULT_PATH = Path("results/results.duckdb")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, algorithm VARCHAR, dataset VARCHAR, setting VARCHAR,
    params JSON, git_rev VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP, status VARCHAR
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id VARCHAR, round INTEGER, mean_acc DOUBLE, bytes_up BIGINT, bytes_down BIGINT, wall_s DOUBLE,
    PRIMARY KEY (run_id, round)
);
CREATE TABLE IF NOT EXISTS client_rounds (
    run_id VARCHAR, round INTEGER, client_id INTEGER, acc DOUBLE, n_test INTEGER,
    PRIMARY KEY (run_id, round, client_id)
);
CREATE TABLE IF NOT EXISTS comm (
    run_id VARCHAR, round INTEGER, client_id INTEGER, direction VARCHAR, kind VARCHAR, bytes BIGINT,
    peer_id INTEGER  -- the other end: -1 = the server; pDFL: the receiving client of a directed edge
);
-- results files written before peer_id existed: add it (old rows read as NULL = unknown)
ALTER TABLE comm ADD COLUMN IF NOT EXISTS peer_id INTEGER;
CREATE TABLE IF NOT EXISTS round_metrics (
    run_id VARCHAR, round INTEGER, name VARCHAR, value DOUBLE, PRIMARY KEY (run_id, round, name)
);
CREATE TABLE IF NOT EXISTS comparison (
    report_id VARCHAR, algorithm VARCHAR, setting VARCHAR, run_id VARCHAR, rounds INTEGER, maua DOUBLE,
    final_acc DOUBLE, bytes_total BIGINT, bytes_setup BIGINT, bytes_training BIGINT, target_acc DOUBLE,
    bytes_to_target BIGINT, speedup DOUBLE
);
"""


class ResultsDB:
    def __init__(self, path: str | Path = DEFAULT_PATH, lock_timeout_s: float = 60.0):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.lock_timeout_s
        while True:
            try:
                con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.IOException as err:  # held by another process: wait for it to close
                if "lock" not in str(err).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        try:
            if not read_only:
                con.execute(SCHEMA)
            yield con
        finally:
            con.close()

    def start_run(self, run_id: str, algorithm: str, dataset: str, setting: str, params: dict, git_rev: str) -> None:
        with self.connect() as con:
            con.execute(
                "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, now(), NULL, 'running')",
                [run_id, algorithm, dataset, setting, json.dumps(params), git_rev],
            )

    def write_round(self, run_id: str, round_: int, mean_acc: float | None, bytes_up: int, bytes_down: int,
                    wall_s: float, client_rows: list[tuple[int, float, int]], comm_rows: list[tuple],
                    extras: dict[str, float] | None = None) -> None:
        """One round's rows in one transaction. client_rows: (client, acc, n_test); comm_rows: (round, client, dir,
        kind, bytes, peer); extras: named round metrics (e.g. a second accuracy reading)."""
        with self.connect() as con:
            con.execute("BEGIN")
            con.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?)", [run_id, round_, mean_acc, bytes_up, bytes_down, wall_s])
            if client_rows:
                con.executemany("INSERT INTO client_rounds VALUES (?, ?, ?, ?, ?)",
                                [(run_id, round_, c, a, n) for c, a, n in client_rows])
            if comm_rows:
                con.executemany("INSERT INTO comm (run_id, round, client_id, direction, kind, bytes, peer_id) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)", [(run_id, *row) for row in comm_rows])
            if extras:
                con.executemany("INSERT INTO round_metrics VALUES (?, ?, ?, ?)",
                                [(run_id, round_, k, v) for k, v in extras.items()])
            con.execute("COMMIT")

    def drop_after(self, run_id: str, round_: int) -> None:
        """Forget rows past `round_` (written after the last checkpoint of a run that crashed)."""
        with self.connect() as con:
            con.execute("BEGIN")
            for table in ("rounds", "client_rounds", "comm", "round_metrics"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND round > ?", [run_id, round_])
            con.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?", [run_id])
            con.execute("COMMIT")

    def write_comparison(self, report_id: str, rows: list[dict]) -> None:
        """Replace the comparison table with this report's rows."""
        cols = ("algorithm", "setting", "run_id", "rounds", "maua", "final_acc", "bytes_total", "bytes_setup",
                "bytes_training", "target_acc", "bytes_to_target", "speedup")
        with self.connect() as con:
            con.execute("BEGIN")
            con.execute("DELETE FROM comparison")
            con.executemany(f"INSERT INTO comparison (report_id, {', '.join(cols)}) VALUES ({', '.join('?' * (len(cols) + 1))})",
                            [(report_id, *(r[c] for c in cols)) for r in rows])
            con.execute("COMMIT")

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        with self.connect() as con:
            con.execute("UPDATE runs SET status = ?, finished_at = now() WHERE run_id = ?", [status, run_id])

    def rounds(self, run_id: str) -> list[tuple]:
        with self.connect(read_only=True) as con:
            return con.execute("SELECT round, mean_acc, bytes_up, bytes_down, wall_s FROM rounds WHERE run_id = ? "
                               "ORDER BY round", [run_id]).fetchall()

    def setup_bytes(self, run_id: str) -> int:
        with self.connect(read_only=True) as con:
            return con.execute("SELECT coalesce(sum(bytes), 0) FROM comm WHERE run_id = ? AND round = 0", [run_id]).fetchone()[0]

    def runs(self) -> list[dict]:
        with self.connect(read_only=True) as con:
            cur = con.execute("SELECT run_id, algorithm, dataset, setting, params, git_rev, started_at, finished_at, status "
                              "FROM runs ORDER BY started_at")
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, row)) for row in cur.fetchall()]

    def series(self, run_ids: list[str]):
        """RunSeries (pipeline.compare) of these runs, in the given order."""
        from pipeline.compare import RunSeries

        out = []
        with self.connect(read_only=True) as con:
            for run_id in run_ids:
                meta = con.execute("SELECT algorithm, setting FROM runs WHERE run_id = ?", [run_id]).fetchone()
                if meta is None:
                    raise KeyError(f"run {run_id} not in {self.path}")
                rows = con.execute("SELECT round, mean_acc, bytes_up, bytes_down FROM rounds WHERE run_id = ? "
                                   "ORDER BY round", [run_id]).fetchall()
                out.append(RunSeries(run_id, meta[0], meta[1], [tuple(r) for r in rows]))
        return out
