"""Opening the results files for a read (no Streamlit): the index `results/results.duckdb` (rebuilt by the report
stage) and each training stage's own `results/runs/<name>/run.duckdb` (pipeline.results.store). A read takes the
index plus every per-run file that changed since the index was built (a stage running now, or one that finished
after the last report), the per-run file's rows replacing the index's for its run: a connection to the process's
in-memory DuckDB host attaches them read-only and its views `runs`, `rounds`, `client_rounds`, `comm` combine them.

The trainer opens its file for each round's write and closes it; while it holds it, DuckDB
refuses any other process (even read-only). So every read attaches the files, reads everything
one view needs in one go, and closes them at once (milliseconds, so the trainer's own retry loop
barely notices); a lock is retried briefly before giving up with `ResultsBusy` (the app then
keeps showing its previous snapshot). A damaged file raises `ResultsDamaged`, naming the file and
the command that makes it again.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import duckdb

from dashboard.data.audit_rows import INDEX_CATALOG
from pipeline import paths
from pipeline.results.store import (RUN_SCHEMA, TABLES, ResultsError, ResultsLocked, attach, detach, fix,
                                    host_cursor, run_files)


# One read at a time in this process: the files a read attaches are named in the DuckDB host database that every
# connection of the process shares (pipeline.results.store.host_cursor), so two reads at once would clash on them.
# A read takes milliseconds; building a database of its own for each took 16 ms more.
_READS = threading.Lock()


class ResultsUnavailable(Exception):
    """The results cannot be shown right now; str(err) is a message for the user."""


class NoResults(ResultsUnavailable):
    """No index and no per-run file (nothing has run yet)."""


class ResultsBusy(ResultsUnavailable):
    """A file stayed locked by a writer (a training round) for the whole retry window."""


class ResultsDamaged(ResultsUnavailable):
    """A file is damaged or not a results file; the message names it and the command that rebuilds it."""


def _changed_ns(path: Path) -> int:
    """When a DuckDB file last changed (its write-ahead log included); 0 if it is gone."""
    times = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            times.append(p.stat().st_mtime_ns)
        except FileNotFoundError:
            pass
    return max(times, default=0)


def results_version(index: Path, runs_dir: Path, *others: Path) -> tuple:
    """When each results file last changed (the index, every per-run file, and `others`): equal versions, the same
    data. A few stat calls: cheap enough to check every second or so."""
    return tuple((str(f), _changed_ns(Path(f))) for f in (index, *run_files(runs_dir), *others))


def live_run_files(index: Path, runs_dir: Path) -> list[Path]:
    """The per-run files the index may not hold as they are now: every one changed since the index
    was built (rebuild_index dates the index to when it read them), all of them without an index."""
    try:
        built = Path(index).stat().st_mtime_ns
    except FileNotFoundError:
        built = -1
    return [f for f in run_files(runs_dir) if _changed_ns(f) > built]


def _combine(con: duckdb.DuckDBPyConnection, index: str | None, live: list[str],
             changed_s: dict[str, float] | None = None) -> None:
    """Temp views runs/rounds/... over the attached catalogs: the index's rows of the runs no live
    file holds, then every live file's rows (an empty typed table underneath gives every column);
    and a temp table file_seen (run_id, seen_s): when each live file last changed (epoch s)."""
    con.execute("CREATE SCHEMA IF NOT EXISTS empty")  # the host's: made by the first read, kept
    con.execute("USE memory.empty")
    con.execute(RUN_SCHEMA)
    con.execute("USE memory.main")
    have = {c: {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = ? "
                                          "AND schema_name = 'main'", [c]).fetchall()} for c in [index, *live] if c}
    fresh = " UNION ".join(f"SELECT run_id FROM {c}.runs" for c in live if "runs" in have[c])
    for table in TABLES:
        parts = [f"SELECT * FROM empty.{table}"]
        for c in [index, *live]:
            if c and table in have[c]:
                where = f" WHERE run_id NOT IN ({fresh})" if c == index and fresh else ""
                parts.append(f"SELECT * FROM {c}.{table}{where}")
        con.execute(f"CREATE TEMP VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
    con.execute("CREATE TEMP TABLE file_seen (run_id VARCHAR, seen_s DOUBLE)")
    for c in live:
        if "runs" in have[c]:
            con.execute(f"INSERT INTO file_seen SELECT run_id, ? FROM {c}.runs", [(changed_s or {}).get(c)])


@contextmanager
def connect_readonly(path: Path, timeout_s: float = 2.0, poll_s: float = 0.05,
                     runs_dir: Path | None = None,
                     notices: list[tuple[str, str]] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection whose views combine the index `path` and its live per-run files (runs_dir,
    default <index dir>/runs), attached read-only and retried while a writer holds one; closed on exit.
    An index that is damaged, or holds no run while per-run files exist, is passed over: every per-run
    file is read instead. `notices` (when given) gets ("warning", text) saying so, with the rebuild command, or
    ("info", text) when per-run files changed since the index was built (they are read directly)."""
    path = Path(path)
    runs_dir = Path(runs_dir) if runs_dir is not None else path.parent / paths.RUNS.name
    live = live_run_files(path, runs_dir)
    if not path.is_file() and not live:
        raise NoResults(f"No results database at `{path}` yet (nor per-run results in `{runs_dir}`). Run the "
                        "pipeline first (`make run`), or point the dashboard at one with FEDCACHE_RESULTS_DB / "
                        "--results-db.")
    deadline = time.monotonic() + timeout_s
    with _READS:
        con, attached = host_cursor(), []
        try:
            yield from _read(con, attached, path, runs_dir, live, deadline, poll_s, notices)
        finally:
            con.close()
            detach(*attached)


def _read(con: duckdb.DuckDBPyConnection, attached: list[str], path: Path, runs_dir: Path, live: list[Path],
          deadline: float, poll_s: float, notices: list[tuple[str, str]] | None) -> Iterator[duckdb.DuckDBPyConnection]:
    """connect_readonly's attaching and combining, on `con`; every alias it attaches is added to `attached`."""
    def attach_or_raise(f: Path, alias: str) -> bool:
        try:
            done = attach(con, f, alias, max(0.0, deadline - time.monotonic()), poll_s)
        except ResultsLocked as err:
            raise ResultsBusy(f"`{f}` is locked by a writer (a training round): {err.why}") from err
        if done:
            attached.append(alias)
        return done

    index, problem = None, None
    if path.is_file():
        every_file = run_files(runs_dir)  # what is read instead of an index that cannot serve
        try:
            index = INDEX_CATALOG if attach_or_raise(path, INDEX_CATALOG) else None
        except ResultsError as err:
            if not every_file:
                raise ResultsDamaged(f"`{path}` is damaged or not a results file ({err.why}). To make it again, "
                                     f"{fix(path)}.") from err
            problem = f"is damaged ({err.why})"
        else:
            empty = index is not None and not _has_runs(con, index)
            problem = "holds no run" if empty and every_file else None
            if problem:
                con.execute(f"DETACH {index}")
                index = None
        if problem:
            live = every_file
            if notices is not None:
                notices.append(("warning", f"The index `{path}` {problem}: showing the {len(live)} per-run files "
                                           f"in `{runs_dir}` directly. To make it again, {fix(path)}."))
        elif live and notices is not None:
            notices.append(("info", f"{len(live)} per-run file(s) in `{runs_dir}` changed since the index `{path}` "
                                    f"was built (a run in progress, or one not indexed yet): read directly. "
                                    f"To fold them into the index, {fix(path)}."))
    fresh, changed_s = [], {}
    for i, f in enumerate(live):
        try:
            if not attach_or_raise(f, f"src{i}"):
                continue  # gone meanwhile (a new run replacing its file)
        except ResultsError as err:
            raise ResultsDamaged(f"`{f}` is damaged or not a results file ({err.why}). To make it again, "
                                 f"{fix(f)}.") from err
        fresh.append(f"src{i}")
        changed_s[f"src{i}"] = _changed_ns(f) / 1e9
    _combine(con, index, fresh, changed_s)
    try:
        yield con
    except duckdb.Error as err:  # a file whose header reads but whose data does not
        names = ", ".join(f"`{f}`" for f in ([path] if index else []) + live)
        raise ResultsDamaged(f"Reading {names} failed ({str(err).splitlines()[0]}). To make the index again, "
                             f"{fix(path)}; a per-run file: re-run its stage.") from err


def _has_runs(con: duckdb.DuckDBPyConnection, catalog: str) -> bool:
    """Whether the attached catalog has a runs table with a row (a new file may have no table yet)."""
    tables = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = 'runs'",
                         [catalog]).fetchone()[0]
    return bool(tables) and con.execute(f"SELECT count(*) FROM {catalog}.runs").fetchone()[0] > 0
