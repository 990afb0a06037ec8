"""Results in DuckDB: each training stage's own file, and an index over all of them.

- `results/runs/<name>/run.duckdb` (RunResultsDB): the rows of one training stage's current run
  (tables runs, rounds, client_rounds, comm, round_metrics), written by the trainer in one
  transaction per round. It lies inside the stage's DVC output (`persist: true`, so a killed
  stage keeps its rows and resumes); a new run of the stage deletes it first.
- `results/results.duckdb` (the index): the same tables over every run, plus the report's
  `comparison`. Nothing writes into it in place: rebuild_index() makes it anew from the per-run
  files in a temporary file and renames that over it, so a reader never sees half an index, and
  the index can be deleted or damaged at any time and made again with nothing lost:

      python -m pipeline.results.store rebuild [--index results/results.duckdb]

The per-run files of an index are `<index dir>/runs/*/run.duckdb`, and the report's table is
`<index dir>/report/comparison.csv`.

A writer opens a file only for the moment of a write and closes it again, so another process
(the dashboard) can read it between writes; whoever finds a file locked waits for a while. A
damaged or foreign file raises ResultsError, one line naming the file and what rebuilds it.
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import json
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb
import numpy as np

from pipeline import paths
from pipeline.errors import ResultsError  # defined there: flows/cli.py prints it without importing DuckDB

TABLES = ("runs", "rounds", "client_rounds", "comm", "round_metrics")  # a run's rows

RUN_SCHEMA = """
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
-- the DVC experiment a run belongs to and the params it changed (pipeline.experiments.dvc); NULL outside one
ALTER TABLE runs ADD COLUMN IF NOT EXISTS experiment VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS changed JSON;
-- what ran: the method plus its non-default knobs (pipeline.results.labels, issue 22); NULL in files from before it
ALTER TABLE runs ADD COLUMN IF NOT EXISTS label VARCHAR;
-- where and how it ran (pipeline.machine.run_environment: command, packages, CPU; the engine's threads and device);
-- NULL in files from before it
ALTER TABLE runs ADD COLUMN IF NOT EXISTS environment JSON;
-- the simulated clock (issue 24; pipeline/federation/clock.py): when the round ended / a row's payload completed,
-- simulated seconds from the run's start; NULL without devices.enabled and in files from before it
ALTER TABLE rounds ADD COLUMN IF NOT EXISTS sim_time_s DOUBLE;
ALTER TABLE comm ADD COLUMN IF NOT EXISTS sim_time_s DOUBLE;
-- the validation split (issue 36): each client's accuracy on it beside its test accuracy; NULL in files from before it
ALTER TABLE client_rounds ADD COLUMN IF NOT EXISTS val_acc DOUBLE;
ALTER TABLE client_rounds ADD COLUMN IF NOT EXISTS n_val INTEGER;
CREATE TABLE IF NOT EXISTS round_metrics (
    run_id VARCHAR, round INTEGER, name VARCHAR, value DOUBLE, PRIMARY KEY (run_id, round, name)
);
"""

INDEX_SCHEMA = RUN_SCHEMA + """
CREATE TABLE IF NOT EXISTS comparison (
    report_id VARCHAR, algorithm VARCHAR, setting VARCHAR, run_id VARCHAR, rounds INTEGER, maua DOUBLE,
    final_acc DOUBLE, bytes_total BIGINT, bytes_setup BIGINT, bytes_training BIGINT, target_acc DOUBLE,
    bytes_to_target BIGINT, speedup DOUBLE, bytes_to_target_no_setup BIGINT, speedup_target DOUBLE,
    speedup_vs VARCHAR, label VARCHAR, sim_time_s DOUBLE, time_to_target DOUBLE, waiting_share DOUBLE,
    maua_low DOUBLE, maua_high DOUBLE, final_low DOUBLE, final_high DOUBLE, test_se DOUBLE, val_maua DOUBLE
);
-- the report's paired differences (pipeline.results.compare.differences): each method minus each reference
CREATE TABLE IF NOT EXISTS differences (
    report_id VARCHAR, label VARCHAR, algorithm VARCHAR, vs VARCHAR, setting VARCHAR, seeds INTEGER,
    maua_diff DOUBLE, maua_low DOUBLE, maua_high DOUBLE, maua_verdict VARCHAR, final_acc_diff DOUBLE,
    final_acc_low DOUBLE, final_acc_high DOUBLE, final_acc_verdict VARCHAR, covers VARCHAR, note VARCHAR
);
-- the privacy audit's figures of each audited run (results/audit/<name>/audit.json; pipeline/results/privacy.py):
-- mean over the audited clients with its 95% interval
CREATE TABLE IF NOT EXISTS privacy (run_id VARCHAR, metric VARCHAR, mean DOUBLE, low DOUBLE, high DOUBLE);
CREATE TABLE IF NOT EXISTS index_meta (key VARCHAR PRIMARY KEY, value VARCHAR);
"""

# What a reader needs of each table (files from before peer_id lack comm.peer_id, from before labels runs.label:
# they read as NULL).
REQUIRED = {
    "runs": {"run_id", "algorithm", "dataset", "setting", "params", "git_rev", "started_at", "finished_at", "status"},
    "rounds": {"run_id", "round", "mean_acc", "bytes_up", "bytes_down", "wall_s"},
    "client_rounds": {"run_id", "round", "client_id", "acc", "n_test"},
    "comm": {"run_id", "round", "client_id", "direction", "kind", "bytes"},
    "round_metrics": {"run_id", "round", "name", "value"},
}
COMPARISON_COLUMNS = ("algorithm", "setting", "run_id", "rounds", "maua", "final_acc", "bytes_total", "bytes_setup",
                      "bytes_training", "target_acc", "bytes_to_target", "speedup", "bytes_to_target_no_setup",
                      "speedup_target", "speedup_vs", "label", "sim_time_s", "time_to_target", "waiting_share",
                      "maua_low", "maua_high", "final_low", "final_high", "test_se", "val_maua")
DIFFERENCE_COLUMNS = ("label", "algorithm", "vs", "setting", "seeds", "maua_diff", "maua_low", "maua_high",
                      "maua_verdict", "final_acc_diff", "final_acc_low", "final_acc_high", "final_acc_verdict", "covers",
                      "note")
PRIVACY_COLUMNS = ("run_id", "metric", "mean", "low", "high")
REBUILD = "python -m pipeline.results.store rebuild"
# New files get 16 KiB blocks instead of DuckDB's 256 KiB: a small run's file is ~0.2 MB instead of ~3 MB
# (each is kept in DVC's cache per version); reading needs nothing special.
BLOCK_SIZE = 16384
NEW_FILE = {"default_block_size": str(BLOCK_SIZE)}  # a new connection's config (ResultsDB.connect: ATTACH's BLOCK_SIZE)

# One in-memory DuckDB database per process hosts every results file a ResultsDB opens, attached while in use: a
# fresh database costs about 16 ms of CPU to build its catalog, an ATTACH about 1 ms, and a training run opens its
# file once a round (the suite: thousands of times). Each use gets a cursor of its own (DuckDB: one per thread).
_HOST: tuple[int, duckdb.DuckDBPyConnection] | None = None
_HOST_LOCK = threading.Lock()
_ALIASES = itertools.count(1)


def host_cursor() -> duckdb.DuckDBPyConnection:
    """A new connection to this process's host database (a forked child builds its own)."""
    global _HOST
    with _HOST_LOCK:
        if _HOST is None or _HOST[0] != os.getpid():
            _HOST = (os.getpid(), duckdb.connect())
        return _HOST[1].cursor()


def detach(*aliases: str) -> None:
    """Detach these databases from the host (those still attached): their files written through and free."""
    with host_cursor() as con:
        for alias in aliases:
            con.execute(f"DETACH DATABASE IF EXISTS {alias}")


class ResultsLocked(ResultsError):
    """Another process still held the file when the wait ran out."""


def rebuild_command(path: str | Path) -> str:
    """What makes `path` again: a per-run file, its training stage; an index, rebuild_index."""
    path = Path(path)
    if path.name == paths.RUN_RESULTS:
        return f"dvc repro -s -f {paths.stage_of_run(path.parent.name)}"
    return REBUILD if path == paths.RESULTS_DB else f"{REBUILD} --index {path}"


def fix(path: str | Path) -> str:
    path = Path(path)
    what = "re-run its stage" if path.name == paths.RUN_RESULTS else "rebuild it from the per-run files"
    return f"{what}: `{rebuild_command(path)}`"


def damaged(path: str | Path, why: str) -> ResultsError:
    return ResultsError(f"{path} is damaged or not a results file ({why}); {fix(path)}", Path(path), why)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


# DuckDB says "Could not set lock on file ...: Conflicting lock is held in ..." (an IOException, the type it
# also raises for a truncated or foreign file, so the words tell them apart); "lock" as a whole word: a
# damaged file's "checksum ... in block at location ..." is not a lock
_BUSY = re.compile(r"\block(ed)?\b|already attached|\bin use\b", re.IGNORECASE)


def _busy(why: str) -> bool:
    """Another process holds the file (a lock), or another connection of this one does."""
    return _BUSY.search(why) is not None


def _being_created(path: Path) -> bool:
    """A writer has created the file but not yet written its header (DuckDB reads that as invalid)."""
    try:
        return path.stat().st_size == 0
    except FileNotFoundError:
        return False


def remove_db(path: str | Path) -> None:
    """Delete a DuckDB file and its write-ahead log."""
    path = Path(path)
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)


def _catalog(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, dict[str, str]]:
    """Each table of the catalog's main schema: its columns and their types."""
    rows = con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() WHERE database_name = ? "
                       "AND schema_name = 'main'", [catalog]).fetchall()
    out: dict[str, dict[str, str]] = {}
    for table, column, type_ in rows:
        out.setdefault(table, {})[column] = type_
    return out


def _columns(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, set[str]]:
    return {table: set(columns) for table, columns in _catalog(con, catalog).items()}


@functools.cache
def _schema_types() -> dict[str, dict[str, str]]:
    """Each table's columns and types as INDEX_SCHEMA (RUN_SCHEMA and the index's own tables) makes them, built once
    in a scratch database of the host: what insert_rows casts to, without asking the catalog each time."""
    with host_cursor() as con:
        con.execute("ATTACH ':memory:' AS schema_probe")
        con.execute("USE schema_probe")
        con.execute(INDEX_SCHEMA)
        types = _catalog(con, "schema_probe")
        con.execute("USE memory")
        con.execute("DETACH schema_probe")
    return types


def _has_current_schema(have: dict[str, set[str]]) -> bool:
    """Whether a catalog with these columns has every table and column of RUN_SCHEMA: then running it (3.5 ms)
    changes nothing."""
    return all(set(_schema_types()[table]) <= have.get(table, set()) for table in TABLES)


def _check_tables(have: dict[str, set[str]]) -> str | None:
    """Why a catalog with these columns does not hold our results tables (a missing table is fine: nothing written
    yet)."""
    for table, needed in REQUIRED.items():
        missing = needed - have.get(table, needed)
        if missing:
            return f"table {table} has no column {', '.join(sorted(missing))}"
    return None


def _attach_when_free(con: duckdb.DuckDBPyConnection, path: Path, alias: str, options: str, timeout_s: float,
                      poll_s: float) -> bool:
    """ATTACH `path` as `alias` with DuckDB's `options` ("READ_ONLY", "BLOCK_SIZE n" or none), waiting up to timeout_s
    while another process (or connection) holds it or a writer has created it without its header yet. False if a
    READ_ONLY file is not there; ResultsLocked / ResultsError (see damaged) otherwise."""
    must_exist = "READ_ONLY" in options
    quoted = "'" + str(path).replace("'", "''") + "'"
    deadline = time.monotonic() + timeout_s
    while True:
        if must_exist and not path.is_file():
            return False
        try:
            con.execute(f"ATTACH {quoted} AS {alias}" + (f" ({options})" if options else ""))
            return True
        except duckdb.Error as err:
            why = _first_line(err)
            locked = _busy(why)
            if time.monotonic() >= deadline or not (locked or _being_created(path)):
                if must_exist and not path.is_file():
                    return False  # replaced meanwhile by a new run and not there yet
                if locked:
                    raise ResultsLocked(f"{path} is locked by another process ({why})", path, why) from err
                raise damaged(path, why) from err
            time.sleep(poll_s)


def attach(con: duckdb.DuckDBPyConnection, path: str | Path, alias: str, timeout_s: float,
           poll_s: float = 0.2) -> bool:
    """ATTACH `path` read-only as `alias`, waiting up to timeout_s while another process holds it.
    False if there is no such file; ResultsLocked / ResultsError (see damaged) otherwise."""
    path = Path(path)
    if not _attach_when_free(con, path, alias, "READ_ONLY", timeout_s, poll_s):
        return False
    try:
        problem = _check_tables(_columns(con, alias))
    except duckdb.Error as err:
        problem = _first_line(err)
    if problem:
        con.execute(f"DETACH {alias}")
        raise damaged(path, problem)
    return True


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...], rows: list[tuple]) -> None:
    """rows (tuples in `columns`' order) into `table` of the connection's database in one statement: each column
    travels as one list, cast to the column's type, and the lists are unnested side by side. executemany runs one
    INSERT a row, about 1 ms each: a paper-scale round's 900 rows took most of a second."""
    if not rows:
        return
    types = _schema_types().get(table, {})
    if not set(columns) <= set(types):  # not one of our tables: ask the catalog
        types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = "
                                 "current_database() AND schema_name = 'main' AND table_name = ?", [table]).fetchall())
    select = ", ".join(f"unnest(?::{types[c]}[])" for c in columns)
    # a list parameter takes Python values only: numpy scalars become their Python equivalents
    lists = [[v.item() if isinstance(v, np.generic) else v for v in col] for col in zip(*rows)]
    con.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select}", lists)


class ResultsDB:
    """A DuckDB file of run rows (tables TABLES). The trainer writes through it (one transaction per round)."""

    def __init__(self, path: str | Path, lock_timeout_s: float = 60.0):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self._held: duckdb.DuckDBPyConnection | None = None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep one writing connection open for the writes inside: each attach and write-through costs a few ms, so
        a bulk writer (sample data: many rounds) opens it once. A stage writes a round at a time, each
        round in a connection of its own, so readers get the file between rounds. Held already: the same connection."""
        if self._held is not None:
            yield
            return
        with self.connect() as con:
            self._held = con
            try:
                yield
            finally:
                self._held = None

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection whose default database is this file, attached to the process's DuckDB host (host_cursor) and
        detached on exit, which writes it through and releases its lock: another process can open it then."""
        if self._held is not None and not read_only:
            yield self._held
            return
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        con, alias = host_cursor(), f"results_{next(_ALIASES)}"
        options = "READ_ONLY" if read_only else "" if self.path.exists() else f"BLOCK_SIZE {BLOCK_SIZE}"
        try:
            if not _attach_when_free(con, self.path, alias, options, self.lock_timeout_s, 0.2):  # read-only, none
                raise ResultsError(f"{self.path} not found; {fix(self.path)}", self.path, "not found")
        except BaseException:
            con.close()
            raise
        try:
            con.execute(f"USE {alias}")
            try:
                have = _columns(con, alias)  # one catalog query serves both checks when nothing is added
                if not read_only and not _has_current_schema(have):
                    con.execute(RUN_SCHEMA)
                    have = _columns(con, alias)
                problem = _check_tables(have)
            except duckdb.Error as err:
                problem = _first_line(err)
            if problem:
                raise damaged(self.path, problem)
            yield con
        finally:
            con.close()  # its open transaction, if any, rolled back: then the file can go
            detach(alias)

    def start_run(self, run_id: str, algorithm: str, dataset: str, setting: str, params: dict, git_rev: str,
                  experiment: str | None = None, changed: dict | None = None, label: str | None = None,
                  environment: dict | None = None) -> None:
        """A new run's row; label: what ran (pipeline.results.labels.run_label), None: unknown; environment: where
        and how it ran (pipeline.machine.run_environment), None: unknown."""
        with self.connect() as con:
            con.execute(
                "INSERT OR REPLACE INTO runs (run_id, algorithm, dataset, setting, params, git_rev, started_at, "
                "finished_at, status, experiment, changed, label, environment) "
                "VALUES (?, ?, ?, ?, ?, ?, now(), NULL, 'running', ?, ?, ?, ?)",
                [run_id, algorithm, dataset, setting, json.dumps(params), git_rev, experiment,
                 None if changed is None else json.dumps(changed), label,
                 None if environment is None else json.dumps(environment)],
            )

    def write_round(self, run_id: str, round_: int, mean_acc: float | None, bytes_up: int, bytes_down: int,
                    wall_s: float, client_rows: list[tuple], comm_rows: list[tuple],
                    extras: dict[str, float] | None = None, sim_time_s: float | None = None) -> None:
        """One round's rows in one transaction. client_rows: (client, acc, n_test[, val_acc, n_val]); comm_rows: (round, client, dir,
        kind, bytes, peer[, sim_time_s]); extras: named round metrics (e.g. a second accuracy reading);
        sim_time_s: the simulated instant the round ended (None: no simulated clock)."""
        comm_rows = [tuple(row) if len(row) == 7 else (*row, None) for row in comm_rows]
        with self.connect() as con:
            con.execute("BEGIN")
            con.execute("INSERT INTO rounds (run_id, round, mean_acc, bytes_up, bytes_down, wall_s, sim_time_s) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", [run_id, round_, mean_acc, bytes_up, bytes_down, wall_s, sim_time_s])
            insert_rows(con, "client_rounds", ("run_id", "round", "client_id", "acc", "n_test", "val_acc", "n_val"),
                        [(run_id, round_, *row, *(None, None)[len(row) - 3:]) for row in client_rows])
            insert_rows(con, "comm", ("run_id", "round", "client_id", "direction", "kind", "bytes", "peer_id",
                                      "sim_time_s"), [(run_id, *row) for row in comm_rows])
            insert_rows(con, "round_metrics", ("run_id", "round", "name", "value"),
                        [(run_id, round_, k, v) for k, v in (extras or {}).items()])
            con.execute("COMMIT")

    def drop_after(self, run_id: str, round_: int) -> None:
        """Forget rows past `round_` (written after the last checkpoint of a run that crashed)."""
        with self.connect() as con:
            con.execute("BEGIN")
            for table in ("rounds", "client_rounds", "comm", "round_metrics"):
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND round > ?", [run_id, round_])
            con.execute("UPDATE runs SET status = 'running', finished_at = NULL WHERE run_id = ?", [run_id])
            con.execute("COMMIT")

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        with self.connect() as con:
            con.execute("UPDATE runs SET status = ?, finished_at = now() WHERE run_id = ?", [status, run_id])

    def resume_problem(self, run_id: str) -> str | None:
        """Why a crashed run cannot continue in this file (None: it can): the file is missing, damaged,
        or does not hold the run. A file another process keeps locked raises ResultsLocked."""
        if not self.path.is_file():
            return f"{self.path} is missing"
        try:
            with self.connect(read_only=True) as con:
                if "runs" not in _columns(con, con.execute("SELECT current_database()").fetchone()[0]):
                    return f"{self.path} does not hold it"
                found = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        except ResultsLocked:
            raise
        except ResultsError as err:
            return str(err)
        except duckdb.Error as err:
            return f"{self.path}: {_first_line(err)}"
        return None if found else f"{self.path} does not hold it"

    def series(self, run_ids: list[str]):
        """RunSeries (pipeline.results.compare) of these runs, in the given order."""
        from pipeline.results.compare import RunSeries

        out = []
        with self.connect(read_only=True) as con:
            columns = _columns(con, con.execute("SELECT current_database()").fetchone()[0])
            have = columns.get("runs", set())
            label = "label" if "label" in have else "NULL"  # a file from before labels (read-only: not migrated)
            sim = "sim_time_s" if "sim_time_s" in columns.get("rounds", set()) else "NULL"  # from before the clock
            # from before the validation split: no val columns (read-only: not migrated)
            val = ("val_acc, n_val" if "val_acc" in columns.get("client_rounds", set()) else "NULL, NULL")
            for run_id in run_ids:
                try:
                    meta = con.execute(f"SELECT algorithm, setting, {label}, params->>'$.seed' FROM runs "
                                       "WHERE run_id = ?", [run_id]).fetchone()
                    clients = con.execute(f"SELECT round, client_id, acc, n_test, {val} FROM client_rounds "
                                          "WHERE run_id = ? ORDER BY round, client_id", [run_id]).fetchall()
                    rows = con.execute(f"SELECT round, mean_acc, bytes_up, bytes_down, {sim} FROM rounds "
                                       "WHERE run_id = ? ORDER BY round", [run_id]).fetchall()
                    busy, client_s = con.execute(
                        "SELECT sum(value) FILTER (WHERE name = 'sim_busy_s'), "
                        "sum(value) FILTER (WHERE name = 'sim_client_s') FROM round_metrics WHERE run_id = ?",
                        [run_id]).fetchone()
                except duckdb.Error as err:
                    raise damaged(self.path, _first_line(err)) from err
                if meta is None:
                    raise ResultsError(f"run {run_id} is not in {self.path}; {fix(self.path)}", self.path,
                                       "no such run")
                times = {r[0]: r[4] for r in rows if r[4] is not None}
                seed = None if meta[3] is None else int(meta[3])
                out.append(RunSeries(run_id, meta[0], meta[1], [tuple(r[:4]) for r in rows], meta[2],
                                     sim_times=times or None, busy_s=busy, client_s=client_s, seed=seed,
                                     clients=[(r, k, a, n) for r, k, a, n, _, _ in clients],
                                     val_clients=[(r, k, va, nv) for r, k, _, _, va, nv in clients
                                                  if va is not None]))
        return out


class RunResultsDB(ResultsDB):
    """One training stage's own results file (results/runs/<name>/run.duckdb). It holds the stage's
    current run only: starting a new run deletes whatever an earlier run left there (stale or damaged)."""

    def start_run(self, run_id: str, algorithm: str, dataset: str, setting: str, params: dict, git_rev: str,
                  experiment: str | None = None, changed: dict | None = None, label: str | None = None,
                  environment: dict | None = None) -> None:
        if self._held is not None:
            raise RuntimeError(f"{self.path}: start a run before held(), which would keep the file it replaces open")
        remove_db(self.path)
        super().start_run(run_id, algorithm, dataset, setting, params, git_rev, experiment, changed, label, environment)


# ----------------------------------------------------------------------------- the index

@dataclass
class Rebuilt:
    """What rebuild_index did. before: the old index was 'missing', 'ok', 'damaged' (why says how),
    'locked' (being read or written: replaced anyway), or 'legacy' (a shared results file from before
    per-run files, moved to `legacy`)."""
    index: Path
    files: list[Path] = field(default_factory=list)
    runs: int = 0
    before: str = "missing"
    why: str = ""
    legacy: Path | None = None

    @property
    def message(self) -> str:
        done = (f"{'built' if self.before == 'missing' else 'rebuilt'} from {len(self.files)} per-run file(s) "
                f"({self.runs} run{'' if self.runs == 1 else 's'})")
        text = f"{self.index} was damaged ({self.why}): {done}" if self.before == "damaged" else f"{self.index} {done}"
        if self.legacy is not None:
            text += f"; the shared results file it replaces (runs from before per-run files) is now {self.legacy}"
        return text


def _index_state(path: Path) -> tuple[str, str]:
    """(state, why) of an existing index, for Rebuilt.before."""
    if not path.exists():
        return "missing", ""
    con = duckdb.connect()
    try:
        try:
            attach(con, path, "old", timeout_s=0.0)
        except ResultsLocked as err:
            return "locked", err.why
        except ResultsError as err:
            return "damaged", err.why
        try:
            have = _columns(con, "old")
            for table in have:
                con.execute(f'SELECT count(*) FROM old."{table}"').fetchone()
            legacy = ("index_meta" not in have and "runs" in have
                      and con.execute("SELECT count(*) FROM old.runs").fetchone()[0] > 0)
        except duckdb.Error as err:
            return "damaged", _first_line(err)
        return ("legacy" if legacy else "ok"), ""
    finally:
        con.close()


def read_comparison_csv(path: str | Path) -> tuple[str, list[dict]]:
    """(report_id, rows) of the report's comparison.csv (pipeline.results.report.write_outputs)."""
    ints = {"rounds", "bytes_total", "bytes_setup", "bytes_training", "bytes_to_target", "bytes_to_target_no_setup"}
    floats = {"maua", "final_acc", "target_acc", "speedup", "speedup_target", "sim_time_s", "time_to_target",
              "waiting_share", "maua_low", "maua_high", "final_low", "final_high", "test_se", "val_maua"}
    rows = _read_csv(path, COMPARISON_COLUMNS, ints, floats)
    return ",".join(r["run_id"] for r in rows), rows


def read_differences_csv(path: str | Path) -> list[dict]:
    """The rows of the report's differences.csv (pipeline.results.report.write_outputs); [] without the file
    (a report from before the paired differences)."""
    if not Path(path).is_file():
        return []
    floats = {"maua_diff", "maua_low", "maua_high", "final_acc_diff", "final_acc_low", "final_acc_high"}
    return _read_csv(path, DIFFERENCE_COLUMNS, {"seeds"}, floats)


def _read_csv(path: str | Path, columns: tuple[str, ...], ints: set[str], floats: set[str]) -> list[dict]:
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for col in columns:
                value = raw.get(col)
                row[col] = (None if value in (None, "") else int(value) if col in ints
                            else float(value) if col in floats else value)
            rows.append(row)
    return rows


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: tuple[str, ...], report_id: str,
            rows: list[dict]) -> None:
    insert_rows(con, table, ("report_id", *columns), [(report_id, *(r.get(c) for c in columns)) for r in rows])


def audit_figures(audit_dir: str | Path) -> list[tuple]:
    """(run_id, metric, mean, low, high) of every audit (audit_dir/<name>/audit.json, flows/audit.py) that names
    its run: its "figures", the privacy table's rows. A damaged file raises ResultsError naming it and the fix."""
    out = []
    for path in sorted(Path(audit_dir).glob("*/audit.json")):
        try:
            audit = json.loads(path.read_text())
            out += [(audit["run_id"], metric, v["mean"], v["low"], v["high"])
                    for metric, v in audit.get("figures", {}).items() if audit.get("run_id")]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ResultsError(f"{path} is damaged ({type(err).__name__}: {err}); write it again with "
                               f"`dvc repro -f {paths.audit_stage_of_run(path.parent.name)}`", path, "damaged") from None
    return out


def run_files(runs_dir: str | Path) -> list[Path]:
    """Every per-run results file under runs_dir (runs_dir/<name>/run.duckdb), sorted."""
    return sorted(Path(runs_dir).glob(f"*/{paths.RUN_RESULTS}"))


def experiment_files(experiments_dir: str | Path) -> list[Path]:
    """Every published experiment's per-run file (experiments_dir/<experiment>/<name>/run.duckdb), sorted."""
    return sorted(Path(experiments_dir).glob(f"*/*/{paths.RUN_RESULTS}"))


def rebuild_index(index: str | Path = paths.RESULTS_DB, runs_dir: str | Path | None = None,
                  comparison: tuple[str, list[dict]] | None = None, report_csv: str | Path | None = None,
                  lock_timeout_s: float = 60.0, differences: list[dict] | None = None) -> Rebuilt:
    """(Re)create the index from every per-run file in runs_dir (default: <index dir>/runs) and every
    experiment's published one (<index dir>/experiments/*/*/run.duckdb, see pipeline.experiments.dvc;
    a file whose run is already in the index, e.g. an experiment applied to the workspace, is skipped).

    The report's comparison table: `comparison` = (report_id, rows) if given (and its paired
    `differences`), else the rows of report_csv (and of differences.csv beside it) if that file exists. Written to a temporary file and renamed over the index, whose
    modification time is set to the moment the per-run files were read (so a reader can tell which
    per-run files changed since). A per-run file that cannot be read raises ResultsError and leaves
    the old index as it was. An index from before per-run files (rows the per-run files may not
    hold) is kept aside as <name>-legacy.duckdb rather than overwritten. Rebuilds of one index take
    turns (a lock file next to it), so the last one sees every file written before it began.
    """
    from filelock import FileLock

    index = Path(index)
    index.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{index}.lock"):
        return _rebuild(index, runs_dir, comparison, report_csv, lock_timeout_s, differences or [])


def _rebuild(index: Path, runs_dir: str | Path | None, comparison: tuple[str, list[dict]] | None,
             report_csv: str | Path | None, lock_timeout_s: float, diffs: list[dict]) -> Rebuilt:
    runs_dir = Path(runs_dir) if runs_dir is not None else index.parent / paths.RUNS.name
    before, why = _index_state(index)
    out = Rebuilt(index, before=before, why=why)
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f"{index.name}.tmp-{os.getpid()}")
    remove_db(tmp)
    read_from = time.time_ns()
    con = duckdb.connect(str(tmp), config=NEW_FILE)
    try:
        con.execute(INDEX_SCHEMA)
        columns = _columns(con, con.execute("SELECT current_database()").fetchone()[0])
        for path in run_files(runs_dir) + experiment_files(index.parent / "experiments"):
            if not attach(con, path, "src", lock_timeout_s):
                continue
            try:
                if con.execute("SELECT count(*) FROM src.runs WHERE run_id IN (SELECT run_id FROM main.runs)").fetchone()[0]:
                    continue  # the same run twice (an applied experiment): its first file counts
                have = _columns(con, "src")
                for table in (t for t in TABLES if t in have):
                    cols = ", ".join(sorted(columns[table] & have[table]))
                    con.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM src.{table}")
            except duckdb.Error as err:
                raise damaged(path, _first_line(err)) from err
            finally:
                con.execute("DETACH src")
            out.files.append(path)
        if comparison is None and report_csv is not None and Path(report_csv).is_file():
            comparison = read_comparison_csv(report_csv)
            diffs = read_differences_csv(Path(report_csv).with_name("differences.csv"))
        if comparison is not None:
            _insert(con, "comparison", COMPARISON_COLUMNS, *comparison)
            _insert(con, "differences", DIFFERENCE_COLUMNS, comparison[0], diffs)
        known = {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()}
        audited = [row for row in audit_figures(index.parent / "audit") if row[0] in known]
        insert_rows(con, "privacy", PRIVACY_COLUMNS, audited)
        out.runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
        insert_rows(con, "index_meta", ("key", "value"),
                    [("built_at", time.strftime("%Y-%m-%dT%H:%M:%S%z")), ("runs_dir", str(runs_dir)),
                     ("files", json.dumps([str(p) for p in out.files]))])
        con.execute("CHECKPOINT")
    except BaseException:
        con.close()
        remove_db(tmp)
        raise
    con.close()
    if before == "legacy":
        out.legacy = index.with_name(f"{index.stem}-legacy{index.suffix}")
        n = 1
        while out.legacy.exists():
            n += 1
            out.legacy = index.with_name(f"{index.stem}-legacy-{n}{index.suffix}")
        os.replace(index, out.legacy)
        wal = index.with_name(index.name + ".wal")
        if wal.exists():
            os.replace(wal, out.legacy.with_name(out.legacy.name + ".wal"))
    index.with_name(index.name + ".wal").unlink(missing_ok=True)  # an old log must not replay onto the new file
    stamp = read_from - 50_000_000  # a little earlier: file times come from a coarser clock
    os.utime(tmp, ns=(stamp, stamp))
    os.replace(tmp, index)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.results.store",
                                     description="The results index (results/results.duckdb).")
    sub = parser.add_subparsers(dest="command", required=True)
    rebuild = sub.add_parser("rebuild", help="(re)build the index from every <index dir>/runs/*/run.duckdb")
    rebuild.add_argument("--index", default=str(paths.RESULTS_DB), help=f"default: {paths.RESULTS_DB}")
    rebuild.add_argument("--runs-dir", help="default: <index dir>/runs")
    rebuild.add_argument("--report-csv",
                         help="the comparison table to include (default: <index dir>/report/comparison.csv)")
    args = parser.parse_args(argv)
    index = Path(args.index)
    report_csv = Path(args.report_csv) if args.report_csv else index.parent / paths.REPORT_DIR.name / "comparison.csv"
    try:
        print(rebuild_index(index, args.runs_dir, report_csv=report_csv).message)
    except ResultsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
