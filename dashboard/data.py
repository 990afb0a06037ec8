"""Reading the results for the dashboard: pure functions, no Streamlit.

The results are the index `results/results.duckdb` (rebuilt by the report stage) and each
training stage's own `results/runs/<name>/run.duckdb` (pipeline.results.store). A read takes the index
plus every per-run file that changed since the index was built (a stage running now, or one that
finished after the last report), the per-run file's rows replacing the index's for its run: one
in-memory DuckDB connection attaches them read-only and its views `runs`, `rounds`,
`client_rounds`, `comm` combine them.

The trainer opens its file for each round's write and closes it; while it holds it, DuckDB
refuses any other process (even read-only). So every read attaches the files, reads everything
one view needs in one go, and closes them at once (milliseconds, so the trainer's own retry loop
barely notices); a lock is retried briefly before giving up with `ResultsBusy` (the app then
keeps showing its previous snapshot). A damaged file raises `ResultsDamaged`, naming the file and
the command that makes it again.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import duckdb
import pandas as pd
import yaml

from pipeline import paths
from pipeline.results import compare
from pipeline.results.compare import RunSeries, comparison, difference_interval
from pipeline.results.intervals import Interval, paired_difference, percent, run_interval
from pipeline.experiments.dvc import flatten
from pipeline.results.store import RUN_SCHEMA, TABLES, ResultsError, ResultsLocked, attach, fix, run_files

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


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
    con.execute("CREATE SCHEMA empty")
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
    con = duckdb.connect()

    def attach_or_raise(f: Path, alias: str) -> bool:
        try:
            return attach(con, f, alias, max(0.0, deadline - time.monotonic()), poll_s)
        except ResultsLocked as err:
            raise ResultsBusy(f"`{f}` is locked by a writer (a training round): {err.why}") from err

    try:
        index, problem = None, None
        if path.is_file():
            every_file = run_files(runs_dir)  # what is read instead of an index that cannot serve
            try:
                index = "src_index" if attach_or_raise(path, "src_index") else None
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
    finally:
        con.close()


def _has_runs(con: duckdb.DuckDBPyConnection, catalog: str) -> bool:
    """Whether the attached catalog has a runs table with a row (a new file may have no table yet)."""
    tables = con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = 'runs'",
                         [catalog]).fetchone()[0]
    return bool(tables) and con.execute(f"SELECT count(*) FROM {catalog}.runs").fetchone()[0] > 0


def _runs_frame(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    df = con.execute(
        "SELECT r.run_id, r.algorithm, r.dataset, r.setting, r.params, r.git_rev, r.started_at, r.finished_at, "
        "r.status, r.experiment, r.changed, r.label AS method_label, "  # (the frame's `label`: the legend's)
        "count(x.round) AS n_rounds, max(x.round) AS last_round, "
        "sum(x.wall_s) AS wall_total, max(x.wall_s) AS wall_max, max(f.seen_s) AS seen_s "
        "FROM runs r LEFT JOIN rounds x USING (run_id) LEFT JOIN file_seen f USING (run_id) "
        "GROUP BY ALL ORDER BY r.started_at, r.run_id").df()
    df["params"] = [json.loads(p) if isinstance(p, str) else (p or {}) for p in df["params"]]
    df["changed"] = [json.loads(c) if isinstance(c, str) else None for c in df["changed"]]
    df["label"] = run_labels(df)
    df["status_shown"] = shown_status(df)
    for key, path in SETUP_KEYS.items():
        df[key] = df["dataset"] if path is None else [_get(p, path) for p in df["params"]]
    return df.drop(columns=["wall_total", "wall_max", "seen_s"])


STALE_AFTER_S = 10 * 60  # a 'running' run with no round for this long (and 3x its slowest round) was likely killed


def shown_status(runs: pd.DataFrame, now: datetime | None = None) -> list[str]:
    """The status to show: 'running' becomes 'stale (no round for N min)' when the last round is old.
    The last round is at least started_at + the rounds' wall_s (a resumed run: more), and at least
    when its per-run file last changed (read from such a file)."""
    now = now or datetime.now()  # started_at is local time (DuckDB's now() stored as TIMESTAMP)
    out = []
    for status, started, wall, slowest, seen in zip(runs["status"], runs["started_at"], runs["wall_total"],
                                                    runs["wall_max"], runs["seen_s"]):
        if status != "running" or pd.isna(started):
            out.append(status)
            continue
        last = pd.Timestamp(started) + pd.Timedelta(seconds=0 if pd.isna(wall) else float(wall))
        if not pd.isna(seen):
            last = max(last, pd.Timestamp(datetime.fromtimestamp(seen)))
        idle = (pd.Timestamp(now) - last).total_seconds()
        stale = idle > max(STALE_AFTER_S, 3 * (0 if pd.isna(slowest) else slowest))
        out.append(f"stale (no round for {int(idle // 60)} min)" if stale else status)
    return out


# What makes runs comparable: the dataset, the number of clients, the number of rounds.
SETUP_KEYS = {"dataset": None, "partition.num_clients": ("partition", "num_clients"), "train.rounds": ("train", "rounds")}


def _get(params: dict, path: tuple[str, ...]):
    for key in path:
        params = params.get(key) if isinstance(params, dict) else None
    return params


def run_labels(runs: pd.DataFrame) -> list[str]:
    """Short unique names for legends: 'fedcache/homo d663c8', or with the DVC experiment the run
    belongs to (a sweep's): 'fedcache/homo ablation_R-R-16'. The method part is what ran, the stored
    label (issue 22: 'pdfl (order=body_then_head)/homo d663c8'), or the algorithm for a run from before
    labels (method_label NULL or, in a frame built without it, absent)."""
    none = [None] * len(runs)
    experiments = runs["experiment"] if "experiment" in runs else none
    methods = [m if isinstance(m, str) and m else a
               for a, m in zip(runs["algorithm"], runs["method_label"] if "method_label" in runs else none)]
    labels = [f"{m}/{s} {e if isinstance(e, str) and e else str(r)[-6:]}"
              for m, s, r, e in zip(methods, runs["setting"], runs["run_id"], experiments)]
    return [lab if labels.count(lab) == 1 else str(r) for lab, r in zip(labels, runs["run_id"])]


def load_runs(path: Path, timeout_s: float = 2.0, runs_dir: Path | None = None,
              notices: list[tuple[str, str]] | None = None) -> pd.DataFrame:
    """All runs (one row each, params parsed, with n_rounds/last_round and a legend label); see
    connect_readonly for `notices`."""
    with connect_readonly(path, timeout_s, runs_dir=runs_dir, notices=notices) as con:
        return _runs_frame(con)


def default_selection(runs: pd.DataFrame) -> list[str]:
    """Per (algorithm, setting): the latest finished run among those of the most common set-up of the
    finished runs (SETUP_KEYS: dataset, clients, rounds), so a 4-round test run or a killed run is not
    picked; without finished runs, the latest run that has written a round (else the latest run). Runs
    differing from a picked one only in their seed (the latest of each seed) are picked with it.
    Finished runs of the workspace come before those of DVC experiments (a sweep's runs vary one param
    each, the Ablations tab's matter): experiments' runs count only when no workspace run finished."""
    if runs.empty:
        return []
    keys = list(SETUP_KEYS)
    done = runs[runs["status"] == "finished"]
    if "experiment" in done:
        workspace = done[done["experiment"].isna() | (done["experiment"] == "")]
        done = workspace if not workspace.empty else done
    if not done.empty:
        setups = done.assign(_k=[tuple(map(str, v)) for v in done[keys].itertuples(index=False)])
        # the most common set-up; a tie goes to the one with the newest run
        counts = setups.groupby("_k").agg(n=("run_id", "size"), newest=("started_at", "max"))
        best = counts.sort_values(["n", "newest"]).index[-1]
        ranked = setups[setups["_k"] == best].sort_values(["started_at", "run_id"])
    else:
        ranked = runs.assign(_has=runs["n_rounds"].fillna(0) > 0).sort_values(["_has", "started_at", "run_id"])
    latest = ranked.groupby(["algorithm", "setting"], sort=False).tail(1)
    # with the other seeds of the same configuration (the latest run of each seed): a seed group
    ranked = ranked.assign(_cfg=_seed_key(ranked), _seed=[_seed(p) for p in ranked["params"]])
    picked = ranked[ranked["_cfg"].isin(set(ranked.loc[latest.index, "_cfg"]))].groupby(["_cfg", "_seed"]).tail(1)
    return picked.sort_values(["setting", "algorithm", "started_at", "run_id"])["run_id"].tolist()


def setup_mismatch(runs: pd.DataFrame, run_ids: list[str]) -> str | None:
    """A warning naming the SETUP_KEYS in which the given runs differ, with each value's runs; None
    when they agree."""
    picked = runs[runs["run_id"].isin(run_ids)]
    parts = []
    for key in SETUP_KEYS:
        values = picked.groupby(picked[key].astype(str), sort=True)["label"].agg(list)
        if len(values) > 1:
            parts.append(f"**{key}** " + "; ".join(f"{v} ({', '.join(labels)})" for v, labels in values.items()))
    if not parts:
        return None
    return "The selected runs are not directly comparable, they differ in " + " · ".join(parts) + "."


ROUND_COLUMNS = ["run_id", "round", "mean_acc", "bytes_up", "bytes_down", "wall_s", "sim_time_s"]
CLIENT_COLUMNS = ["run_id", "round", "client_id", "acc", "n_test", "val_acc", "n_val"]  # val: the validation split
WAITING_COLUMNS = ["run_id", "busy_s", "client_s"]  # the waiting share's figures summed per run (docs/devices.md)
METRIC_COLUMNS = ["run_id", "round", "name", "value"]
# What FedCache's server records per evaluated round about its knowledge cache (pipeline/methods/fedcache):
# the share of samples with a teacher, the mean age (rounds) of the knowledge teachers are built from, the
# share of teachers whose argmax is the label, and their mean entropy (nats). The Cache tab draws them.
CACHE_METRICS = ("cache_coverage", "cache_staleness", "cache_teacher_acc", "cache_teacher_entropy")


@dataclass
class Snapshot:
    """Everything the live views show, read in one connection."""
    runs: pd.DataFrame  # every run in the DB (see load_runs)
    rounds: pd.DataFrame  # run_id, round, mean_acc, bytes_up, bytes_down, wall_s (selected runs)
    clients: pd.DataFrame  # run_id, round, client_id, acc, n_test, val_acc, n_val
    comm_rounds: pd.DataFrame  # run_id, round, direction, kind, bytes (summed over clients)
    comm_clients: pd.DataFrame  # run_id, client_id, direction, kind, bytes (summed over rounds)
    read_at: float = field(default_factory=time.time)
    # the rounds (as `rounds`) of every sweep run (ablation_runs), selected or not: the Ablations tab
    ablation_rounds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=ROUND_COLUMNS))
    # and their clients' rows (as `clients`): the Ablations tab's intervals
    ablation_clients: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CLIENT_COLUMNS))
    # the selected runs' knowledge-cache metrics (CACHE_METRICS; run_id, round, name, value), and every run
    # in the DB that has them, selected or not (the Cache tab names them when none selected has any)
    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=METRIC_COLUMNS))
    cache_runs: list[str] = field(default_factory=list)
    # the selected runs' sim_busy_s / sim_client_s round metrics summed (timed runs only): the waiting share
    waiting: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WAITING_COLUMNS))

    @cached_property
    def labels(self) -> dict[str, str]:
        """run_id -> label (a dict: the views look labels up hundreds of times a page)."""
        return dict(zip(self.runs["run_id"], self.runs["label"]))

    def label(self, run_id: str) -> str:
        return self.labels.get(run_id, run_id)


def load_snapshot(path: Path, run_ids: list[str], timeout_s: float = 2.0, runs_dir: Path | None = None) -> Snapshot:
    ids = list(dict.fromkeys(run_ids))
    with connect_readonly(path, timeout_s, runs_dir=runs_dir) as con:
        runs = _runs_frame(con)
        q = ", ".join("?" * len(ids)) or "NULL"

        def read(table: str, sql: str, columns: list[str]) -> pd.DataFrame:
            if not ids:
                return pd.DataFrame(columns=columns)
            return con.execute(sql.format(q=q), ids).df()

        rounds = read("rounds", "SELECT run_id, round, mean_acc, bytes_up, bytes_down, wall_s, sim_time_s FROM rounds "
                      "WHERE run_id IN ({q}) ORDER BY run_id, round", ROUND_COLUMNS)
        swept = ablation_runs(runs)["run_id"].tolist()  # in the same read: one attach per refresh
        ablation_rounds = con.execute(
            "SELECT run_id, round, mean_acc, bytes_up, bytes_down, wall_s, sim_time_s FROM rounds WHERE run_id IN "
            f"({', '.join('?' * len(swept))}) ORDER BY run_id, round", swept).df() if swept else \
            pd.DataFrame(columns=ROUND_COLUMNS)
        ablation_clients = con.execute(
            "SELECT run_id, round, client_id, acc, n_test, val_acc, n_val FROM client_rounds WHERE run_id IN "
            f"({', '.join('?' * len(swept))}) ORDER BY run_id, round, client_id", swept).df() if swept else \
            pd.DataFrame(columns=CLIENT_COLUMNS)
        clients = read("client_rounds", "SELECT run_id, round, client_id, acc, n_test, val_acc, n_val "
                       "FROM client_rounds WHERE run_id IN ({q}) ORDER BY run_id, round, client_id", CLIENT_COLUMNS)
        comm_rounds = read("comm", "SELECT run_id, round, direction, kind, sum(bytes)::BIGINT AS bytes FROM comm "
                           "WHERE run_id IN ({q}) GROUP BY ALL ORDER BY ALL",
                           ["run_id", "round", "direction", "kind", "bytes"])
        comm_clients = read("comm", "SELECT run_id, client_id, direction, kind, sum(bytes)::BIGINT AS bytes FROM comm "
                            "WHERE run_id IN ({q}) GROUP BY ALL ORDER BY ALL",
                            ["run_id", "client_id", "direction", "kind", "bytes"])
        names = ", ".join(f"'{n}'" for n in CACHE_METRICS)
        metrics = read("round_metrics", f"SELECT run_id, round, name, value FROM round_metrics WHERE run_id IN ({{q}}) "
                       f"AND name IN ({names}) ORDER BY run_id, round, name", METRIC_COLUMNS)
        waiting = read("round_metrics", "SELECT run_id, sum(value) FILTER (WHERE name = 'sim_busy_s') AS busy_s, "
                       "sum(value) FILTER (WHERE name = 'sim_client_s') AS client_s FROM round_metrics "
                       "WHERE run_id IN ({q}) AND name IN ('sim_busy_s', 'sim_client_s') GROUP BY run_id",
                       WAITING_COLUMNS)
        cache_runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM round_metrics WHERE name = ?",
                                                [CACHE_METRICS[0]]).fetchall()]
    # keep the caller's run order in every frame (legends, table rows)
    order = {r: i for i, r in enumerate(ids)}
    frames = []
    for df in (rounds, clients, comm_rounds, comm_clients, metrics):
        df = df.sort_values("run_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
        frames.append(df)
    recorded = set(cache_runs)
    return Snapshot(runs, *frames[:4], ablation_rounds=ablation_rounds, ablation_clients=ablation_clients,
                    metrics=frames[4],
                    cache_runs=[r for r in runs["run_id"] if r in recorded], waiting=waiting)  # oldest first


# ----------------------------------------------------------------------------- derived views

def series(snap: Snapshot, run_ids: list[str], rounds: pd.DataFrame | None = None,
           clients: pd.DataFrame | None = None) -> list[RunSeries]:
    """pipeline.results.compare.RunSeries of the runs that have rounds, in the given order (rounds: snap.rounds,
    or another frame of its columns such as snap.ablation_rounds), with the run's `seed` (its params') and its
    clients' accuracies on the test and validation splits (clients: snap.clients, the selected runs', or
    snap.ablation_clients), so that the comparison carries 95% intervals (pipeline.results.intervals)."""
    meta = snap.runs.set_index("run_id")
    rounds = snap.rounds if rounds is None else rounds
    waiting = snap.waiting.set_index("run_id")
    wanted = set(run_ids)
    per_run = {r: g for r, g in rounds.groupby("run_id", sort=False) if r in wanted} if not rounds.empty else {}
    clients = snap.clients if clients is None else clients
    per_client = {r: g for r, g in clients.groupby("run_id", sort=False) if r in wanted} if not clients.empty else {}
    out = []
    for run_id in dict.fromkeys(run_ids):
        rows = per_run.get(run_id)
        if rows is None or rows.empty or run_id not in meta.index:
            continue
        sim = rows["sim_time_s"] if "sim_time_s" in rows else pd.Series(dtype=float)
        times = {int(r): float(t) for r, t in zip(rows["round"], sim) if pd.notna(t)}  # devices on: simulated instants
        busy, client_s = (waiting.at[run_id, "busy_s"], waiting.at[run_id, "client_s"]) if run_id in waiting.index \
            else (None, None)
        seed = (meta.at[run_id, "params"] or {}).get("seed")
        test, val = _client_rows(per_client.get(run_id))
        out.append(RunSeries(run_id, meta.at[run_id, "algorithm"], meta.at[run_id, "setting"], [
            (int(r), None if pd.isna(a) else float(a), int(u), int(d))
            for r, a, u, d in zip(rows["round"], rows["mean_acc"], rows["bytes_up"], rows["bytes_down"])],
            sim_times=times or None, busy_s=None if pd.isna(busy) else float(busy),
            client_s=None if pd.isna(client_s) else float(client_s),
            seed=int(seed) if isinstance(seed, (int, float)) and not isinstance(seed, bool) else None,
            clients=test, val_clients=val))
    return out


def _client_rows(df: pd.DataFrame | None) -> tuple[list[tuple], list[tuple]]:
    """(test rows, validation rows) as RunSeries takes them: (round, client, acc, n) each; NULL accuracy stays None
    (a client without a sample), a run from before the validation split has no validation rows."""
    if df is None or df.empty:
        return [], []

    def rows(acc: str, n: str) -> list[tuple]:
        return [(int(r), int(k), None if pd.isna(a) else float(a), 0 if pd.isna(m) else int(m))
                for r, k, a, m in zip(df["round"], df["client_id"], df[acc], df[n]) if not (pd.isna(a) and pd.isna(m))]

    test = rows("acc", "n_test")
    val = rows("val_acc", "n_val") if "val_acc" in df and df["val_acc"].notna().any() else []
    return test, val


# ----------------------------------------------------------------------------- intervals and ties
# 95% intervals (pipeline.results.intervals: a bootstrap over clients, tens of milliseconds each) are
# remembered by the rows they come from, across refreshes and sessions of the server process: a page that
# re-reads every few seconds recomputes only what a new round changed.

MEMO_SIZE = 4096
_memo: OrderedDict = OrderedDict()
_memo_lock = threading.Lock()


def _remembered(key: tuple, compute):
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    value = compute()
    with _memo_lock:
        _memo[key] = value
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return value


def _fingerprint(s: RunSeries) -> tuple:
    """What a run's intervals depend on: its client rows (a new round, or rows rewritten by a resumed run,
    change it)."""
    return s.run_id, len(s.clients), hash(tuple(s.clients)), len(s.val_clients), hash(tuple(s.val_clients))


INTERVAL_KEYS = ("maua_low", "maua_high", "final_low", "final_high", "test_se", "n_clients", "val_maua")


def run_intervals(s: RunSeries) -> dict:
    """The comparison row's interval columns of one run (pipeline.results.compare: its MAUA and final
    accuracy with 95% intervals over its clients, ...), remembered; all None when the run has fewer than
    two clients evaluated (no interval to draw)."""
    def compute() -> dict:
        try:
            return compare.run_intervals(s)
        except ValueError:  # one client: nothing to resample
            return dict.fromkeys(INTERVAL_KEYS)

    return _remembered(("run", _fingerprint(s)), compute)


def _maua_interval(s: RunSeries) -> Interval | None:
    iv = run_intervals(s)
    return None if iv["maua_low"] is None or s.maua is None else Interval(s.maua, iv["maua_low"], iv["maua_high"], "")


def paired(a: RunSeries, b: RunSeries) -> Interval | None:
    """a - b in MAUA, paired by client (pipeline.results.intervals.paired_difference), when the two runs can be
    paired as the report pairs them: the same seed, and the same clients with the same test splits. None
    otherwise (another seed or partition, or no client rows)."""
    if a.seed != b.seed or a.run_id == b.run_id:
        return None
    first, second = (a, b) if a.run_id < b.run_id else (b, a)  # one bootstrap per pair, whichever way it is asked

    def compute() -> Interval | None:
        try:
            x, y = first.accuracies(), second.accuracies()
            if x is None or y is None:
                return None
            return paired_difference([x], [y], "maua")
        except ValueError:  # other clients or test splits (another partition), one client, or incomplete rows
            return None

    diff = _remembered(("pair", _fingerprint(first), _fingerprint(second)), compute)
    if diff is None or first is a:
        return diff
    return Interval(-diff.estimate, -diff.high, -diff.low, diff.covers)


@dataclass(frozen=True)
class Versus:
    """How run a compares with run b in MAUA: verdict "ahead" / "behind" / "tied", and how it was decided:
    "paired" (the paired difference's 95% interval, `interval`), "overlap" (the two runs cannot be paired: their
    own intervals, tied when they overlap) or "point" (a run without intervals: the MAUAs themselves)."""

    verdict: str
    how: str
    interval: Interval | None = None

    def text(self) -> str:
        if self.how == "paired":
            return f"paired difference {percent(self.interval, signed=True)} points"
        return {"overlap": "95% intervals overlap (not paired: another seed or partition)",
                "point": "no interval (no per-client rows)"}.get(self.how, self.how)


def versus(a: RunSeries, b: RunSeries) -> Versus:
    """a against b in MAUA (Versus): paired when they can be (paired), else by their own intervals."""
    diff = paired(a, b)
    if diff is not None:
        return Versus(diff.verdict, "paired", diff)
    x, y = _maua_interval(a), _maua_interval(b)
    if x is not None and y is not None:
        verdict = "ahead" if x.low > y.high else "behind" if x.high < y.low else "tied"
        return Versus(verdict, "overlap")
    if a.maua is None or b.maua is None:
        return Versus("tied", "point")
    return Versus("ahead" if a.maua > b.maua else "behind" if a.maua < b.maua else "tied", "point")


def maua_leaders(runs: list[RunSeries]) -> tuple[list[str], dict[str, Versus]]:
    """The runs a "best MAUA" mark may go to: the run of the highest MAUA and every run tied with it (versus);
    one run only when it is ahead of every other. Returns (their run ids, the highest first; each other
    leader's Versus against the highest)."""
    placed = [s for s in runs if s.maua is not None]
    if not placed:
        return [], {}
    top = max(placed, key=lambda s: s.maua)
    ties = {}
    for s in placed:
        if s is not top:
            v = versus(top, s)
            if v.verdict != "ahead":
                ties[s.run_id] = v
    return [top.run_id, *ties], ties


def best_maua_text(runs: list[RunSeries], leaders: list[str], ties: dict[str, Versus], name) -> str:
    """One sentence under the table about the highest MAUA, in words that follow the intervals."""
    if not leaders:
        return ""
    if len(leaders) == 1:
        if len(runs) < 2:
            return ""
        return (f"Highest MAUA: {name(leaders[0])}, ahead of every other selected run (95% intervals, paired by "
                "client where two runs share a seed and partition).")
    return (f"Highest MAUA: tied between {', '.join(name(r) for r in leaders)} (marked alike): "
            + "; ".join(f"{name(leaders[0])} vs {name(r)}: {v.text()}" for r, v in ties.items())
            + ". None of them is ahead of the others.")


def has_sim_time(curves: pd.DataFrame) -> bool:
    """Whether any of the curves' runs has simulated time (devices.enabled: the overview offers it as an x axis)."""
    return "sim_s" in curves and curves["sim_s"].notna().any()


def default_target(runs: list[RunSeries], snap: Snapshot | None = None) -> float:
    """A level every shown run reaches, so that every row's bytes to target and speed-up are measured at
    that one level: the report's target (`report.target_acc` for the dataset, from the first shown run's
    params: the table then matches results/report/comparison.md) when every run reaches it, else the
    lowest MAUA among them, rounded down to a percent."""
    mauas = [s.maua for s in runs if s.maua is not None]
    lowest = math.floor(min(mauas) * 100) / 100 if mauas else 0.5
    if snap is not None and runs:
        params = snap.runs.loc[snap.runs["run_id"] == runs[0].run_id, "params"]
        params = params.iloc[0] if len(params) else {}
        target = params.get("report", {}).get("target_acc", {}).get(params.get("data", {}).get("dataset"))
        if isinstance(target, (int, float)) and 0 < target <= lowest:
            return float(target)
    return lowest


COSTLIEST = ""  # a baseline no algorithm is called: pipeline.results.compare falls back to the costliest run reaching the target


def default_baseline(algorithms) -> str:
    """FedAvg when one of the runs is FedAvg (the paper's reference), else the costliest run reaching the target."""
    return "fedavg" if "fedavg" in set(algorithms) else COSTLIEST


TABLE_INTERVALS = ["maua_low", "maua_high", "final_low", "final_high"]  # 95% intervals (pipeline.results.intervals)


def comparison_frame(snap: Snapshot, run_ids: list[str], target: float, include_setup: bool = True,
                     baseline: str = "fedavg", runs: list[RunSeries] | None = None) -> pd.DataFrame:
    """pipeline.results.compare.comparison of the runs, speed-ups against `baseline` (an algorithm, or COSTLIEST),
    with MAUA and final accuracy's 95% intervals (NaN for a run with fewer than two clients evaluated). `runs`:
    series(snap, run_ids) when the caller has them already."""
    runs = series(snap, run_ids) if runs is None else runs
    # the intervals once per run's rows (run_intervals remembers them), not again for every table built
    rows = comparison([replace(s, clients=[], val_clients=[]) for s in runs], target, include_setup, baseline=baseline)
    for row, s in zip(rows, runs):
        row.update(run_intervals(s))
    # the simulated clock's columns only when a run has simulated time (a plain comparison stays as it was)
    timed = [] if not any(r["sim_time_s"] is not None for r in rows) else ["time_to_target", "waiting_share", "sim_time_s"]
    df = pd.DataFrame(rows, columns=["algorithm", "setting", "run_id", "rounds", "maua", "final_acc", "bytes_total",
                                     "bytes_setup", "bytes_training", "target_acc", "bytes_to_target", *timed[:2],
                                     "speedup", "speedup_target", "speedup_vs", *timed[2:], *TABLE_INTERVALS])
    df[TABLE_INTERVALS] = df[TABLE_INTERVALS].astype(float)
    status = snap.runs.set_index("run_id")["status_shown"]
    df.insert(3, "status", [status.get(r, "") for r in df["run_id"]])
    df.insert(0, "run", [snap.label(r) for r in df["run_id"]])
    return df


def accuracy_text(value, low=None, high=None) -> str:
    """'71.3% [68.7, 73.9]': an accuracy with its 95% interval, to the precision the interval supports
    (pipeline.results.intervals.percent); '71.30%' without an interval, '—' without a value."""
    if value is None or pd.isna(value):
        return "—"
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return f"{value:.2%}"
    return percent(Interval(float(value), float(low), float(high), ""))


PAPER_COLUMNS = ["run", "run_id", "table", "maua", "paper_maua", "difference", "gb_total", "gb_to_target",
                 "paper_gb", "speedup", "speedup_why", "paper_speedup", "reference"]


def paper_frame(snap: Snapshot, run_ids: list[str], target: float, include_setup: bool = True,
                figures: list | None = None, run_series: list[RunSeries] | None = None) -> pd.DataFrame:
    """Each selected run beside the FedCache paper's figures for its (dataset, method, setting)
    (paper/fedcache_tables.csv); runs the paper has no row for are left out. The measured speed-up is
    against the paper's reference method of that table (pFedMe for Table 5, FedDKC for Table 6) when
    a run of it is selected, else None. `difference`: MAUA minus the paper's, in points. `run_series`: series(snap,
    run_ids) when the caller has them."""
    from pipeline.results import paper

    figures = paper.load() if figures is None else figures
    runs = snap.runs.set_index("run_id")
    matched = {}
    for rid in run_ids:
        if rid in runs.index:
            r = runs.loc[rid]
            hit = paper.lookup(figures, r["dataset"], r["algorithm"], r["setting"])
            if hit is not None:
                matched[rid] = hit
    rows = []
    if matched and run_series is None:
        run_series = series(snap, run_ids)  # once, for every reference's table
    for reference in sorted({p.reference for p in matched.values()}):
        table = comparison_frame(snap, run_ids, target, include_setup, reference, run_series).set_index("run_id")
        for rid, p in matched.items():
            if p.reference != reference or rid not in table.index:
                continue
            m = table.loc[rid]
            against_reference = m["speedup_vs"] == reference  # compare falls back to another run when it has none
            speedup = m["speedup"] if against_reference else None
            rows.append({"run": snap.label(rid), "run_id": rid, "table": p.table, "maua": m["maua"],
                         "paper_maua": p.maua,
                         "difference": None if p.maua is None or m["maua"] is None else (m["maua"] - p.maua) * 100,
                         "gb_total": m["bytes_total"] / 1e9,
                         "gb_to_target": None if pd.isna(m["bytes_to_target"]) else m["bytes_to_target"] / 1e9,
                         "paper_gb": p.comm_gb, "speedup": speedup,
                         "speedup_why": "" if speedup is not None and pd.notna(speedup) else
                         f"no {reference} run selected" if not against_reference else NOT_REACHED,
                         "paper_speedup": p.speedup, "reference": reference})
    return pd.DataFrame(rows, columns=PAPER_COLUMNS)


PAPER_PRINTS_NONE = "— (the paper prints '-')"


def sortable_paper_table(frame: pd.DataFrame) -> Styler:
    """paper_frame for people, sorting by its numbers: percentages, bytes in KB/MB/GB (the paper's GB as
    GB), speed-ups as '12.3x', and '—' with the reason where there is no number."""
    shown = frame.copy().reset_index(drop=True)

    def percent(v, missing):
        return missing if v is None or pd.isna(v) else f"{v:.1%}"

    shown["maua"] = [percent(v, "—") for v in frame["maua"]]
    shown["paper_maua"] = [percent(v, PAPER_PRINTS_NONE) for v in frame["paper_maua"]]
    shown["difference"] = ["—" if v is None or pd.isna(v) else f"{v:+.1f}" for v in frame["difference"]]
    shown["gb_total"] = [fmt_bytes(v * 1e9) for v in frame["gb_total"]]
    shown["gb_to_target"] = [fmt_bytes(None if v is None or pd.isna(v) else v * 1e9, NOT_REACHED)
                             for v in frame["gb_to_target"]]
    shown["paper_gb"] = [PAPER_PRINTS_NONE if v is None or pd.isna(v) else f"{v:g} GB" for v in frame["paper_gb"]]
    shown["speedup"] = [f"{v:.1f}x" if v is not None and pd.notna(v) else f"— ({why})"
                        for v, why in zip(frame["speedup"], frame["speedup_why"])]
    shown["paper_speedup"] = [PAPER_PRINTS_NONE if v is None or pd.isna(v) else f"{v:.1f}x"
                              for v in frame["paper_speedup"]]
    columns = ["maua", "paper_maua", "difference", "gb_total", "gb_to_target", "paper_gb", "speedup", "paper_speedup"]
    values = frame.reset_index(drop=True).copy()
    for col in columns:
        values[col] = pd.to_numeric(values[col], errors="coerce").astype(float)
    return shown_as(values.drop(columns=["speedup_why"]), shown, columns)


NOT_REACHED = "not reached"


def fmt_bytes(n, missing: str = "—") -> str:
    """1234567 -> '1.2 MB' (decimal units, one decimal; bytes as a whole number)."""
    if n is None or pd.isna(n):
        return missing
    n = float(n)
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 999.95 or unit == "TB":
            return f"{n:.1f} {unit}"


def display_table(table: pd.DataFrame, include_setup: bool = True) -> pd.DataFrame:
    """comparison_frame for people: MAUA and final accuracy with their 95% interval ('71.3% [68.7, 73.9]'),
    bytes as KB/MB/GB, 'not reached' instead of empty, the speed-up as '2.50x' and what it is measured
    against ('fedavg at 64.0%')."""
    out = table.copy()
    for col, (low, high) in (("maua", ("maua_low", "maua_high")), ("final_acc", ("final_low", "final_high"))):
        out[col] = [accuracy_text(v, lo, hi) for v, lo, hi in zip(table[col], table.get(low, [None] * len(table)),
                                                                 table.get(high, [None] * len(table)))]
    for col in ("bytes_total", "bytes_setup", "bytes_training"):
        out[col] = [fmt_bytes(v) for v in table[col]]
    out["bytes_to_target"] = [fmt_bytes(v, NOT_REACHED) for v in table["bytes_to_target"]]

    def speedup(row) -> str:
        if pd.notna(row.speedup):
            return f"{row.speedup:.2f}x"
        sent = row.bytes_total if include_setup else row.bytes_training
        reached = pd.notna(row.speedup_target) and pd.notna(row.maua) and row.maua >= row.speedup_target
        return "no bytes sent" if reached and sent == 0 else NOT_REACHED

    out["speedup"] = [speedup(row) for row in table.itertuples()]
    out["speedup_vs"] = vs_texts(table)
    if "time_to_target" in table:  # timed runs (docs/devices.md); "—" and why for a run without simulated time
        untimed = table["sim_time_s"].isna()
        out["time_to_target"] = [NO_CLOCK if no else NOT_REACHED if pd.isna(t) else f"{t:,.1f} s"
                                 for t, no in zip(table["time_to_target"], untimed)]
        out["waiting_share"] = [NO_CLOCK if no else "not recorded" if pd.isna(w) else f"{w:.1%}"
                                for w, no in zip(table["waiting_share"], untimed)]
        out = out.drop(columns=["sim_time_s"])
    return out.drop(columns=["speedup_target"])


NO_CLOCK = "— (devices off)"  # a run without simulated time, beside timed ones


def vs_texts(table: pd.DataFrame) -> list[str]:
    """What each speed-up is measured against: 'fedavg at 64.0%' (columns speedup_vs, speedup_target)."""
    return [f"{vs} at {level:.1%}" if isinstance(vs, str) and pd.notna(level) else "no run reaches the target"
            for vs, level in zip(table["speedup_vs"], table["speedup_target"])]


def speedup_sort_values(speedups, texts) -> list[float]:
    """A speed-up column's numbers for sorting: 'not reached' below every number, 'no bytes sent' above."""
    return [float(v) if pd.notna(v) else -math.inf if text == NOT_REACHED else math.inf
            for v, text in zip(speedups, texts)]


def csv_table(table: pd.DataFrame, include_setup: bool = True) -> str:
    """comparison_frame as CSV: the raw numbers, and `speedup_note` saying why a speed-up is empty
    ('no bytes sent' or 'not reached')."""
    out = table.copy()
    notes = display_table(table, include_setup)["speedup"]
    out["speedup_note"] = ["" if pd.notna(v) else note for v, note in zip(table["speedup"], notes)]
    return out.to_csv(index=False)


BYTES_COLUMNS = ["bytes_total", "bytes_setup", "bytes_training", "bytes_to_target"]


def shown_as(values: pd.DataFrame, shown: pd.DataFrame, columns: list[str]) -> Styler:
    """`values` as a Styler that displays `shown`'s text in `columns`. st.dataframe sorts a column by
    its values and draws the Styler's text, so bytes sort as numbers ('950.0 KB' below '6.1 MB', which
    text would put above) while reading as KB/MB/GB. The text may depend on more than the cell's value
    (a seed group's '± std'), so each cell gets its text: one Styler.format per distinct text and column."""
    values = values.reset_index(drop=True)
    styler = values.style
    for col in columns:
        texts = pd.Series(shown[col].to_numpy(), index=values.index)
        for text, rows in texts.groupby(texts, sort=False).groups.items():
            styler.format(lambda _, t=text: t, subset=pd.IndexSlice[list(rows), [col]])
    return styler


def sortable_table(table: pd.DataFrame, include_setup: bool = True, leaders: list[str] | None = None) -> Styler:
    """comparison_frame as display_table shows it, each shown column sorting by its number: MAUA and final
    accuracy by the estimate (shown with its interval), bytes ('not reached' as +inf: after every number)
    and the speed-up ('no bytes sent' +inf, 'not reached' -inf: the cheapest first and the misses last when
    sorted from the top). `leaders`: the run ids the best-MAUA mark goes to (maua_leaders; see mark_best)."""
    shown = display_table(table, include_setup).reset_index(drop=True)
    values = shown.copy()
    for col in ("maua", "final_acc", *BYTES_COLUMNS):
        values[col] = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)
    values["bytes_to_target"] = values["bytes_to_target"].fillna(math.inf)
    values["speedup"] = speedup_sort_values(table["speedup"], shown["speedup"])
    timed = [c for c in ("time_to_target", "waiting_share") if c in table]
    for col in timed:  # seconds and shares sort as numbers; not reached / no clock last
        values[col] = pd.to_numeric(table[col], errors="coerce").to_numpy(dtype=float)
        values[col] = values[col].fillna(math.inf)
    styler = shown_as(values, shown, ["maua", "final_acc", *BYTES_COLUMNS, "speedup", *timed])
    return mark_best(styler, values, leaders)


BEST = "font-weight: bold; background-color: rgba(89, 161, 79, 0.18)"
TIED = "font-weight: bold; background-color: rgba(237, 201, 72, 0.22)"  # tied leaders: none of them is the best


def overlap_leaders(values: pd.DataFrame) -> list[int]:
    """Rows of the highest MAUA and of every run whose 95% interval (maua_low, maua_high) overlaps its: the
    leaders when the runs cannot be paired. Without interval columns, the rows of the highest MAUA."""
    maua = pd.to_numeric(values["maua"], errors="coerce")
    if maua.dropna().empty:
        return []
    top = int(maua.idxmax())
    if "maua_low" not in values or pd.isna(values.at[top, "maua_low"]):
        return [i for i, v in maua.items() if v == maua[top]]
    low = pd.to_numeric(values["maua_low"], errors="coerce")
    high = pd.to_numeric(values["maua_high"], errors="coerce")
    # a run without an interval beside runs with one: tied unless the top's interval is above its MAUA
    return [i for i, v in maua.items()
            if pd.notna(v) and (i == top or (high[i] if pd.notna(high[i]) else v) >= low[top])]


def mark_best(styler: Styler, values: pd.DataFrame, leaders: list[str] | None = None) -> Styler:
    """The answer at a glance: the fewest bytes among the runs that send any (bytes are exact), and the best
    MAUA only when one run is ahead of every other. When the highest MAUA is tied with another run (their
    paired difference's 95% interval contains 0 or, where they cannot be paired, their intervals overlap), no
    run is the best: every tied leader is marked alike, in the TIED style (the caption says "tied").
    `leaders`: run ids (maua_leaders: paired where possible); None: by overlap_leaders on `values`."""
    if leaders is not None:
        rows = [i for i, r in enumerate(values["run_id"]) if r in set(leaders)] if "run_id" in values else []
    else:
        rows = overlap_leaders(values.reset_index(drop=True))
    style = BEST if len(rows) == 1 else TIED

    def maua(column: pd.Series) -> list[str]:
        return [style if i in rows else "" for i in range(len(column))]

    def fewest(column: pd.Series) -> list[str]:
        candidates = column[column > 0]
        if candidates.dropna().empty:
            return [""] * len(column)
        return [BEST if v == candidates.min() else "" for v in column]

    return styler.apply(maua, subset=["maua"]).apply(fewest, subset=["bytes_total"])


def run_algorithms(snap: Snapshot, run_ids: list[str]) -> dict[str, str]:
    """Legend label -> algorithm of the given runs, in order (the charts' colour per method)."""
    algo = snap.runs.set_index("run_id")["algorithm"]
    return {snap.label(r): algo[r] for r in run_ids if r in algo.index}


def _with_run(snap: Snapshot, df: pd.DataFrame) -> pd.DataFrame:
    """Adds the legend label and the algorithm of each row's run."""
    algo = snap.runs.set_index("run_id")["algorithm"]
    df["run"] = [snap.label(r) for r in df["run_id"]]
    df["algorithm"] = [algo.get(r, "") for r in df["run_id"]]
    return df


def smoothed(curves: pd.DataFrame, weight: float) -> pd.DataFrame:
    """The curves with each run's mean accuracy as an exponential moving average (weight 0: as is; 0.9:
    heavy), bias-corrected at the start as TensorBoard's slider does; the measured values stay in
    `mean_acc_raw`. Only what is drawn is smoothed: MAUA and bytes to target read the raw rounds."""
    out = curves.copy()
    out["mean_acc_raw"] = out["mean_acc"]
    if weight > 0 and not out.empty:
        out["mean_acc"] = out.groupby("run_id", sort=False)["mean_acc"].transform(
            lambda acc: acc.ewm(alpha=1 - weight, adjust=True).mean())
    return out


def accuracy_curves(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Per run and evaluated round: mean accuracy, cumulative bytes (up + down) and cumulative
    wall-clock seconds (the rounds' wall_s) so far."""
    cols = ["run", "algorithm", "run_id", "round", "mean_acc", "cum_bytes", "cum_s", "sim_s"]
    if snap.rounds.empty:
        return pd.DataFrame(columns=cols)
    df = snap.rounds.copy()
    per_round = df["bytes_up"].astype("int64") + df["bytes_down"].astype("int64")
    if not include_setup:
        per_round = per_round.where(df["round"] > 0, 0)
    df["cum_bytes"] = per_round.groupby(df["run_id"]).cumsum()
    df["cum_s"] = df["wall_s"].fillna(0).groupby(df["run_id"]).cumsum()
    # the round's simulated instant (devices.enabled; already cumulative from the run's start), else NaN
    df["sim_s"] = df["sim_time_s"] if "sim_time_s" in df else float("nan")
    df = _with_run(snap, df).dropna(subset=["mean_acc"])
    return df[cols].reset_index(drop=True)


def best_round_clients(snap: Snapshot) -> pd.DataFrame:
    """Every client's accuracy at its run's best round (the round of the MAUA)."""
    cols = ["run", "algorithm", "run_id", "round", "client_id", "acc", "n_test"]
    evaluated = snap.rounds.dropna(subset=["mean_acc"])
    if evaluated.empty or snap.clients.empty:
        return pd.DataFrame(columns=cols)
    best = evaluated.loc[evaluated.groupby("run_id", sort=False)["mean_acc"].idxmax(), ["run_id", "round"]]
    df = _with_run(snap, snap.clients.merge(best, on=["run_id", "round"]))
    return df[cols].reset_index(drop=True)


def client_history(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = _with_run(snap, snap.clients[snap.clients["client_id"] == client_id].copy())
    return df[["run", "algorithm", "run_id", "round", "acc", "n_test"]].reset_index(drop=True)


def client_bytes(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = snap.comm_clients[snap.comm_clients["client_id"] == client_id].copy()
    df["run"] = [snap.label(r) for r in df["run_id"]]
    return df[["run", "direction", "kind", "bytes"]].reset_index(drop=True)


def client_bytes_table(snap: Snapshot, client_id: int) -> pd.DataFrame:
    """One row per run: the bytes client `client_id` sent ("up: knowledge") and received ("down: ...")
    by what they carry (KIND_FAMILIES), up first, in FAMILY_ORDER; only the columns some run has."""
    df = client_bytes(snap, client_id)
    if df.empty:
        return pd.DataFrame(columns=["run"])
    df["column"] = [f"{d}: {family(k)}" for d, k in zip(df["direction"], df["kind"])]
    table = df.pivot_table(index="run", columns="column", values="bytes", aggfunc="sum", sort=False)
    rank = {f: i for i, f in enumerate(FAMILY_ORDER)}
    order = sorted(table.columns, key=lambda c: (c.split(": ")[0] != "up", rank.get(c.split(": ", 1)[1], 99), c))
    return table[order].reset_index()


def cache_stats(snap: Snapshot) -> pd.DataFrame:
    """Per selected run that recorded its knowledge cache (FedCache) and evaluated round: the four
    CACHE_METRICS as columns (NaN where a round has none: the teacher figures before any sample has a
    teacher) beside the run's mean user accuracy, in the selection's run order."""
    cols = ["run", "algorithm", "run_id", "round", *CACHE_METRICS, "mean_acc"]
    if snap.metrics.empty:
        return pd.DataFrame(columns=cols)
    wide = snap.metrics.pivot_table(index=["run_id", "round"], columns="name", values="value", aggfunc="last",
                                    sort=False).reset_index()
    for name in CACHE_METRICS:
        if name not in wide:
            wide[name] = float("nan")
    wide = wide.merge(snap.rounds[["run_id", "round", "mean_acc"]], on=["run_id", "round"], how="left")
    order = {r: i for i, r in enumerate(dict.fromkeys(snap.metrics["run_id"]))}
    wide = wide.sort_values(["run_id", "round"], key=lambda c: c.map(order) if c.name == "run_id" else c)
    wide = _with_run(snap, wide.reset_index(drop=True))
    return wide[cols].astype({n: "float64" for n in [*CACHE_METRICS, "mean_acc"]}).reset_index(drop=True)


# What a payload kind carries (the ledger's kinds, pipeline/methods): four families a reader compares methods by.
KIND_FAMILIES = {"hashes": "set-up", "logits": "knowledge", "knowledge": "knowledge", "class_logits": "knowledge",
                 "server_logits": "knowledge", "params": "parameters", "model": "parameters", "feedback": "parameters",
                 "global": "parameters", "block1": "parameters", "block2": "parameters", "block3": "parameters",
                 "prototypes": "features", "features": "features"}
FAMILY_ORDER = ["set-up", "knowledge", "parameters", "features"]


def family(kind: str) -> str:
    """'logits' -> 'knowledge'; a kind no method here sends stays itself."""
    return KIND_FAMILIES.get(kind, kind)


def _traffic(snap: Snapshot, include_setup: bool) -> pd.DataFrame:
    df = snap.comm_rounds
    if not include_setup:
        df = df[df["round"] > 0]
    df = df.assign(family=[family(k) for k in df["kind"]])
    return _with_run(snap, df.reset_index(drop=True))


def bytes_by_family(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Total bytes per run, family and direction (`flow`: 'knowledge up'), with the kinds it sums."""
    df = _traffic(snap, include_setup)
    columns = ["run", "algorithm", "family", "direction", "flow", "kinds", "bytes"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    out = df.groupby(["run", "algorithm", "family", "direction"], sort=False, as_index=False).agg(
        kinds=("kind", lambda k: ", ".join(sorted(set(k)))), bytes=("bytes", "sum"))
    out["flow"] = out["family"] + " " + out["direction"]
    rank = {f: i for i, f in enumerate(FAMILY_ORDER)}  # the families in reading order, then any other; up first
    out = out.sort_values(["family", "direction"], key=lambda c: c.map(rank).fillna(len(rank)) if c.name == "family"
                          else c.map({"up": 0, "down": 1}), kind="stable")
    return out[columns].reset_index(drop=True)


def bytes_per_round(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Bytes per run and round, up and down and their total (every selected run, one line each)."""
    df = _traffic(snap, include_setup)
    columns = ["run", "run_id", "algorithm", "round", "up", "down", "bytes"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    out = df.pivot_table(index=["run", "run_id", "algorithm", "round"], columns="direction", values="bytes",
                         aggfunc="sum", fill_value=0).reset_index()
    for direction in ("up", "down"):
        if direction not in out:
            out[direction] = 0
    out["bytes"] = out["up"] + out["down"]
    return out[columns].sort_values(["run", "round"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- seeds as groups

def _seed_key(runs: pd.DataFrame) -> pd.Series:
    """Per run: (algorithm, setting, params without the top-level seed) as one hashable key."""
    return pd.Series([(a, st, json.dumps({k: v for k, v in (p or {}).items() if k != "seed"}, sort_keys=True, default=str))
                      for a, st, p in zip(runs["algorithm"], runs["setting"], runs["params"])], index=runs.index, dtype=object)


def _seed(params) -> str:
    return str((params or {}).get("seed"))


def seed_groups(runs: pd.DataFrame) -> pd.Series:
    """A group label per run (same index): runs of one algorithm and setting whose params differ only
    in the top-level `seed` form a group, labelled by its first run's label plus '(n seeds)' when
    n > 1 ('(n runs)' when some share a seed: repeats)."""
    if runs.empty:
        return pd.Series([], index=runs.index, dtype=object)
    key = _seed_key(runs)
    first = runs["label"].groupby(key, sort=False).transform("first")
    size = key.map(key.value_counts())
    seeds = pd.Series([_seed(p) for p in runs["params"]], index=runs.index).groupby(key).transform("nunique")
    return pd.Series([f if n == 1 else f"{f} ({n} seeds)" if k == n else f"{f} ({n} runs)"
                      for f, n, k in zip(first, size, seeds)], index=runs.index, dtype=object)


def has_seed_groups(runs: pd.DataFrame) -> bool:
    """Whether 2+ of these runs differ only in their seed (the 'Group seeds' toggle's default)."""
    if runs.empty:
        return False
    seeds = pd.Series([_seed(p) for p in runs["params"]], index=runs.index)
    return bool((seeds.groupby(_seed_key(runs)).nunique() > 1).any())


def _groups_of(snap: Snapshot, run_ids: list[str]) -> pd.Series:
    """run_id -> group label for the given runs."""
    known = set(snap.runs["run_id"])
    picked = snap.runs.set_index("run_id").loc[[r for r in dict.fromkeys(run_ids) if r in known]].reset_index()
    return pd.Series(seed_groups(picked).to_numpy(), index=picked["run_id"], dtype=object)


def group_algorithms(snap: Snapshot, run_ids: list[str]) -> dict[str, str]:
    """Group label -> algorithm, in order (the charts' colour per method)."""
    algo = snap.runs.set_index("run_id")["algorithm"]
    return {g: algo[r] for r, g in _groups_of(snap, run_ids).items() if r in algo.index}


def group_curves(snap: Snapshot, curves: pd.DataFrame, run_ids: list[str]) -> pd.DataFrame:
    """accuracy_curves averaged over each seed group and round: mean_acc (mean), acc_min/acc_max (the
    band), cum_bytes and cum_s (means), n (runs with that round). The group label is in 'run'."""
    cols = ["run", "algorithm", "round", "mean_acc", "acc_min", "acc_max", "cum_bytes", "cum_s", "sim_s", "n"]
    if curves.empty:
        return pd.DataFrame(columns=cols)
    df = curves.assign(run=curves["run_id"].map(_groups_of(snap, run_ids)))
    if "sim_s" not in df:
        df["sim_s"] = float("nan")
    out = df.groupby(["run", "algorithm", "round"], sort=False).agg(
        mean_acc=("mean_acc", "mean"), acc_min=("mean_acc", "min"), acc_max=("mean_acc", "max"),
        cum_bytes=("cum_bytes", "mean"), cum_s=("cum_s", "mean"), sim_s=("sim_s", "mean"),
        n=("run_id", "size")).reset_index()
    return out[cols]


def group_table(snap: Snapshot, table: pd.DataFrame, run_ids: list[str],
                runs: list[RunSeries] | None = None) -> pd.DataFrame:
    """comparison_frame aggregated per seed group: n seeds, mean and std of MAUA, final accuracy,
    bytes total and bytes to target (over the runs that reach it: n_reached), speed-up mean; and the
    group's MAUA over its seeds with its 95% interval (pipeline.results.compare.method_rows: maua_estimate,
    maua_low, maua_high, seeds, covers; NaN without client rows). `runs`: series(snap, run_ids) if known."""
    df = table.assign(group=table["run_id"].map(_groups_of(snap, run_ids)))
    out = df.groupby("group", sort=False).agg(
        algorithm=("algorithm", "first"), setting=("setting", "first"), n=("run_id", "size"),
        maua_mean=("maua", "mean"), maua_std=("maua", "std"), final_acc_mean=("final_acc", "mean"),
        bytes_total_mean=("bytes_total", "mean"), bytes_to_target_mean=("bytes_to_target", "mean"),
        bytes_to_target_std=("bytes_to_target", "std"), n_reached=("bytes_to_target", "count"),
        speedup_mean=("speedup", "mean"), target_acc=("target_acc", "first"),
        speedup_vs=("speedup_vs", "first"), speedup_target=("speedup_target", "first")).reset_index()
    rows = {r["label"]: r for r in method_rows(named_series(snap, series(snap, run_ids) if runs is None else runs,
                                                              group_seeds=True))}
    for key, col in (("maua", "maua_estimate"), ("maua_low", "maua_low"), ("maua_high", "maua_high"),
                     ("seeds", "seeds"), ("covers", "covers")):
        out[col] = [rows[g][key] if g in rows else None for g in out["group"]]
    out[["maua_estimate", "maua_low", "maua_high"]] = out[["maua_estimate", "maua_low", "maua_high"]].astype(float)
    return out


def named_series(snap: Snapshot, runs: list[RunSeries], group_seeds: bool = False) -> list[RunSeries]:
    """The runs named as the page shows them, for pipeline.results.compare's grouping by name and setting: each
    run by its legend label, or (group_seeds) by its seed group's, so that a group's seeds pair with another
    group's by seed (compare.method_rows, compare.differences)."""
    names = _groups_of(snap, [s.run_id for s in runs]) if group_seeds else None
    return [replace(s, label=names.get(s.run_id, snap.label(s.run_id)) if names is not None else snap.label(s.run_id),
                    **({} if _resampled(s) else {"clients": [], "val_clients": []}))
            for s in runs]


def _resampled(s: RunSeries) -> bool:
    """Whether a run's client rows give an interval: two clients or more, every one at every evaluation (a run
    without, such as one client's, is left out of compare's intervals as a run without rows is)."""
    def compute() -> bool:
        try:
            acc = s.accuracies()
        except ValueError:
            return False
        return acc is not None and len(acc.n) >= 2

    return _remembered(("resampled", _fingerprint(s)), compute)


def _key(runs: list[RunSeries]) -> tuple:
    return tuple((s.name, s.algorithm, s.setting, s.seed, _fingerprint(s)) for s in runs)


def method_rows(runs: list[RunSeries]) -> list[dict]:
    """pipeline.results.compare.method_rows (each name over its seeds, with 95% intervals), remembered."""
    return _remembered(("methods", _key(runs)), lambda: compare.method_rows(runs))


def differences(runs: list[RunSeries]) -> list[dict]:
    """pipeline.results.compare.differences (every run or group against local-only and FedCache of its setting,
    paired, with "ahead" / "behind" / "tied"), remembered."""
    return _remembered(("differences", _key(runs)), lambda: compare.differences(runs))


DIFFERENCE_HEADER = ["method", "vs", "seeds", "MAUA difference, points [95% CI]", "verdict"]


def difference_table(rows: list[dict]) -> pd.DataFrame:
    """differences for people: each pair's MAUA difference with its interval ('+1.8 [-3.0, +7.1]', points, to
    the interval's precision) and the verdict ("tied" whenever the interval contains 0); a pair that could
    not be paired says why."""
    out = []
    for r in rows:
        if r.get("maua_diff") is None:
            out.append([r["label"], r["vs"], r["seeds"], f"— ({r['note']})", ""])
        else:
            out.append([r["label"], r["vs"], r["seeds"], percent(difference_interval(r), signed=True),
                        r["maua_verdict"]])
    return pd.DataFrame(out, columns=DIFFERENCE_HEADER)


def markdown_table(df: pd.DataFrame) -> str:
    """A small table as Markdown (no data grid: the page keeps one, bench/dashboard_load.py)."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def display_group_table(groups: pd.DataFrame) -> pd.DataFrame:
    """group_table for people: MAUA over the seeds with its 95% interval '81.2% [80.1, 82.3] (3 seeds)' (mean ±
    std without client rows), bytes to target '1.2 MB ± 0.1 MB (3 seeds)' ('2 of 3 seeds' when some miss the
    target, 'not reached' when all do)."""
    def pm(mean, std, fmt) -> str:
        return fmt(mean) if pd.isna(std) else f"{fmt(mean)} ± {fmt(std)}"

    def seeds(k: int, n: int) -> str:
        return f"({n} seed{'s' if n > 1 else ''})" if k == n else f"({k} of {n} seeds)"

    out = pd.DataFrame({"group": groups["group"], "algorithm": groups["algorithm"], "setting": groups["setting"]})
    # MAUA over the seeds with its 95% interval (compare.method_rows; what it covers: `covers`), else mean ± std
    low = groups["maua_low"] if "maua_low" in groups else pd.Series([None] * len(groups), index=groups.index)
    high = groups["maua_high"] if "maua_high" in groups else low
    estimate = groups["maua_estimate"] if "maua_estimate" in groups else low
    counted = groups["seeds"] if "seeds" in groups else groups["n"]
    out["maua"] = [f"{pm(m, s, '{:.1%}'.format)} {seeds(n, n)}" if pd.isna(lo) or pd.isna(k) else
                   f"{accuracy_text(e, lo, hi)} {seeds(int(k), int(k))}"
                   for m, s, n, e, lo, hi, k in zip(groups["maua_mean"], groups["maua_std"], groups["n"], estimate,
                                                    low, high, counted)]
    out["final_acc"] = groups["final_acc_mean"]
    out["bytes_total"] = [fmt_bytes(v) for v in groups["bytes_total_mean"]]
    out["bytes_to_target"] = [NOT_REACHED if k == 0 else f"{pm(m, s, fmt_bytes)} {seeds(k, n)}" for m, s, k, n in zip(
        groups["bytes_to_target_mean"], groups["bytes_to_target_std"], groups["n_reached"], groups["n"])]
    out["speedup"] = [f"{v:.2f}x" if pd.notna(v) else "no bytes sent" if sent == 0 else NOT_REACHED
                      for v, sent in zip(groups["speedup_mean"], groups["bytes_total_mean"])]
    out["speedup_vs"] = vs_texts(groups)
    return out


def sortable_group_table(groups: pd.DataFrame) -> Styler:
    """display_group_table's text, each column sorting by its mean: MAUA, bytes total, bytes to target
    (+inf when no seed reaches it) and the speed-up (-inf when not reached)."""
    shown = display_group_table(groups).reset_index(drop=True)
    values = shown.copy()
    values["maua"] = (groups["maua_estimate"].fillna(groups["maua_mean"]) if "maua_estimate" in groups
                      else groups["maua_mean"]).to_numpy(dtype=float)
    values["bytes_total"] = groups["bytes_total_mean"].to_numpy(dtype=float)
    values["bytes_to_target"] = [m if k > 0 else math.inf
                                 for m, k in zip(groups["bytes_to_target_mean"], groups["n_reached"])]
    values["speedup"] = speedup_sort_values(groups["speedup_mean"], shown["speedup"])
    return shown_as(values, shown, ["maua", "bytes_total", "bytes_to_target", "speedup"])


# ----------------------------------------------------------------------------- ablations (sweeps)

def _same_value(text: str, value) -> bool:
    """Whether the value part of an experiment's name is this param value. pipeline.experiments.sweeps names an
    experiment <sweep>-<last part of key>-<value as a -S flag> (characters a git ref does not take
    replaced by '_'); the flag reads back as YAML."""
    if isinstance(value, (dict, list)):
        return False
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    if isinstance(parsed, bool) or isinstance(value, bool):
        return parsed is value
    if isinstance(parsed, (int, float)) and isinstance(value, (int, float)):
        return math.isclose(parsed, value, rel_tol=1e-9)
    return parsed == value or text == str(value)


def swept_key(experiment: str | None, params: dict | None, changed: dict | None) -> tuple[str, str] | None:
    """(key, sweep name) of a run of a one-key-at-a-time sweep, None for any other run. The key is the
    param whose name and value end the experiment's name (`ablation_R-R-16`: index.R = 16, sweep
    ablation_R), preferring the keys `changed` lists: a sweep's value that equals params.yaml's (R 16)
    changes nothing. An experiment named otherwise (`dvc exp run -S index.R=4`) counts when it changed
    exactly one key. `seed` is never an ablation: its sweeps are repetitions (Group seeds)."""
    if not isinstance(experiment, str) or not experiment:
        return None
    changed = changed if isinstance(changed, dict) else {}
    found, named = [], False
    for key, value in flatten(params or {}).items():
        if key == "seed":
            continue
        sweep, sep, text = experiment.rpartition(f"-{key.rsplit('.', 1)[-1]}-")
        named = named or bool(sep and sweep)
        if sep and sweep and _same_value(text, value):
            found.append((key, sweep))
    found = [f for f in found if f[0] in changed] or found
    if len(found) == 1:
        return found[0]
    if not named and len(changed) == 1:  # not a sweep's name: a run that changed one plain value
        key, value = next(iter(changed.items()))
        if key != "seed" and not isinstance(value, (list, dict)):
            return key, experiment
    return None


ABLATION_RUN_COLUMNS = ["run_id", "label", "algorithm", "setting", "status", "started_at", "key", "value", "sweep",
                        "context", "also_changed", "seed"]


def ablation_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of one-key-at-a-time sweeps (`python -m pipeline.experiments.sweeps run NAME`, see swept_key): the
    swept key, its value and the sweep, and `context`, the setting and every other param but the seed as
    one text: the runs of one ablation share it (the same configuration but for the swept key), so two
    sweeps of one key with the same `set` join, and sweeps with different `set`s stay apart.
    `also_changed`: the other params the run changed against params.yaml (the sweep's `set`)."""
    rows = []
    if runs.empty or "experiment" not in runs:
        return pd.DataFrame(columns=ABLATION_RUN_COLUMNS)
    for r in runs[runs["experiment"].notna()].itertuples(index=False):
        found = swept_key(r.experiment, r.params, r.changed)
        if found is None:
            continue
        key, sweep = found
        flat = flatten(r.params or {})
        context = json.dumps([r.setting, {k: v for k, v in flat.items() if k not in (key, "seed")}],
                             sort_keys=True, default=str)
        others = {k: v for k, v in (r.changed or {}).items() if k not in (key, "seed")}
        rows.append((r.run_id, r.label, r.algorithm, r.setting, r.status, r.started_at, key, flat.get(key), sweep,
                     context, ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(others.items())),
                     str(flat.get("seed"))))
    out = pd.DataFrame(rows, columns=ABLATION_RUN_COLUMNS)
    out["value"] = pd.Series([row[7] for row in rows], dtype=object)  # as in params: R 16 stays 16, not 16.0
    return out


ABLATION_COLUMNS = ["ablation", "key", "sweeps", "also_changed", "value", "algorithm", "setting", "line", "maua",
                    "maua_low", "maua_high", "covers", "bytes", "seeds", "runs"]


def ablation_points(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """One row per ablation, swept value and method (the paper's section 5.3 figures): MAUA (the best
    mean user accuracy over rounds, RunSeries.maua as in the comparison table) and the bytes the run
    sent up to its last round (set-up traffic included or not), each the mean over the seeds run (the
    latest run of each seed, a finished one before an unfinished one). `ablation` names the swept key
    (with its sweeps when the key was swept in more than one configuration); `line` is the method
    (with the setting when the ablation has both). maua_low / maua_high: MAUA's 95% interval over those
    seeds (intervals.run_interval; `covers` says what it covers), None where a run has no client rows."""
    abl = ablation_runs(snap.runs)
    found = {s.run_id: s for s in series(snap, abl["run_id"].tolist(), snap.ablation_rounds, snap.ablation_clients)}
    abl = abl[abl["run_id"].isin(found)]
    if abl.empty:
        return pd.DataFrame(columns=ABLATION_COLUMNS)
    abl = abl.assign(
        maua=[found[r].maua for r in abl["run_id"]],
        bytes=[found[r].total_bytes - (0 if include_setup else found[r].setup_bytes) for r in abl["run_id"]],
        _value=[json.dumps(v, sort_keys=True, default=str) for v in abl["value"]],  # hashable, lists too
        _done=abl["status"] == "finished")
    latest = abl.sort_values(["_done", "started_at", "run_id"]).groupby(
        ["key", "context", "_value", "algorithm", "setting", "seed"], sort=False).tail(1)
    points = latest.groupby(["key", "context", "_value", "algorithm", "setting"], sort=False).agg(
        value=("value", "first"), maua=("maua", "mean"), bytes=("bytes", "mean"), seeds=("seed", "size"),
        runs=("label", ", ".join), also_changed=("also_changed", "first"),
        _ids=("run_id", list)).reset_index()
    bounds = [_seeds_interval([found[r] for r in ids]) for ids in points["_ids"]]
    points["maua_low"], points["maua_high"], points["covers"] = zip(*bounds) if bounds else ((), (), ())
    # the ablation's name: its key, plus its sweeps when the key was swept in more than one configuration
    sweeps = latest.groupby(["key", "context"])["sweep"].agg(lambda s: ", ".join(sorted(set(s))))
    contexts = points.groupby("key")["context"].nunique()
    points["sweeps"] = [sweeps[(k, c)] for k, c in zip(points["key"], points["context"])]
    points["ablation"] = [k if contexts[k] == 1 else f"{k} ({sw})" for k, sw in zip(points["key"], points["sweeps"])]
    settings = points.groupby("ablation")["setting"].nunique()
    points["line"] = [a if settings[ab] == 1 else f"{a}/{st}"
                      for a, st, ab in zip(points["algorithm"], points["setting"], points["ablation"])]
    points["_order"] = [v if isinstance(v, (int, float)) and not isinstance(v, bool) else math.inf
                        for v in points["value"]]
    points = points.sort_values(["ablation", "line", "_order", "_value"], kind="stable")
    return points[ABLATION_COLUMNS].reset_index(drop=True)


def _seeds_interval(runs: list[RunSeries]) -> tuple[float | None, float | None, str | None]:
    """MAUA's 95% interval over one ablation point's seeds (low, high, what it covers); Nones without client rows."""
    accs = [s.accuracies() for s in runs]
    if any(a is None for a in accs):
        return None, None, None
    iv = run_interval(accs, "maua")
    return iv.low, iv.high, iv.covers


# ----------------------------------------------------------------------------- params: diff and filter

MISSING = "(absent)"
RUN_META = ("algorithm", "setting", "dataset", "git_rev")  # run columns compared and filtered along with the params


def run_params(runs: pd.DataFrame, run_id: str) -> dict[str, object]:
    """A run's params flattened to dotted keys, with its run columns as `run.<column>`."""
    return _row_params(runs.loc[runs["run_id"] == run_id].iloc[0])


def _row_params(row) -> dict[str, object]:
    return {**{f"run.{k}": row[k] for k in RUN_META if k in row}, **flatten(row["params"] or {})}


def _every_run_params(runs: pd.DataFrame) -> list[dict[str, object]]:
    """run_params of every run, in order (one pass over the rows, not a lookup per run)."""
    return [_row_params(row) for _, row in runs.iterrows()]


def _as_text(value) -> str:
    """One dtype per column for Arrow, and values compared as they read: JSON text (absent stays a word)."""
    return value if value is MISSING else json.dumps(value, sort_keys=True, default=str)


def params_diff(named: dict[str, dict[str, object]]) -> pd.DataFrame:
    """The keys whose values differ among N flattened params (name -> run_params): one row per key, one
    column per name, absent keys included. No row when all agree."""
    keys = sorted(set().union(*named.values())) if named else []
    rows = []
    for key in keys:
        values = [_as_text(flat.get(key, MISSING)) for flat in named.values()]
        if len(set(values)) > 1:
            rows.append([key, *values])
    return pd.DataFrame(rows, columns=["key", *named])


def varying_params(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Every key (run columns and params, dotted) on which the runs do not all agree -> its values as text,
    sorted: what the sidebar can filter on."""
    flats = _every_run_params(runs)
    keys = sorted(set().union(*flats)) if flats else []
    out = {}
    for key in keys:
        values = {_as_text(f.get(key, MISSING)) for f in flats}
        if len(values) > 1:
            out[key] = sorted(values)
    return out


def with_param(runs: pd.DataFrame, key: str, values: list[str]) -> pd.DataFrame:
    """The runs whose value of `key` (as varying_params writes it) is one of `values`."""
    keep = [_as_text(flat.get(key, MISSING)) in values for flat in _every_run_params(runs)]
    return runs[keep]


def pareto_points(table: pd.DataFrame, include_setup: bool = True,
                  runs: list[RunSeries] | None = None) -> pd.DataFrame:
    """comparison_frame's runs as (run, algorithm, maua with maua_low/maua_high, bytes) placed against the
    accuracy-vs-bytes trade-off, counting ties. Bytes are the run's total up to its last round (set-up included
    or not): counted, exact. MAUA is an estimate with a 95% interval, so a run is beaten only when another run
    with no more bytes is ahead of it with an interval that excludes a tie (versus: the paired difference when
    the two can be paired, else their own intervals; with `runs` None, or a run without intervals, the
    intervals in the table, else the MAUAs themselves). Columns:
    `frontier`: no other run beats it so (on the frontier or its band);
    `tied`: on it, but tied in MAUA with another such run (the frontier's band: neither is the better);
    `tied_with`: those runs' names. Runs without a MAUA are left out."""
    bytes_col = "bytes_total" if include_setup else "bytes_training"
    cols = ["run", "run_id", "algorithm", "setting", "maua", *(c for c in ("maua_low", "maua_high") if c in table),
            bytes_col]
    pts = table.loc[table["maua"].notna(), [c for c in cols if c in table]].rename(
        columns={bytes_col: "bytes"}).reset_index(drop=True)
    for c in ("maua_low", "maua_high"):
        if c not in pts:
            pts[c] = float("nan")
    pts["bytes"] = pts["bytes"].astype(float)
    pts["maua"] = pts["maua"].astype(float)
    found = {s.run_id: s for s in runs or []}

    def verdict(i: int, j: int) -> str:
        """Row i against row j in MAUA: "ahead", "behind" or "tied"."""
        a, b = (found.get(pts.at[k, "run_id"]) if "run_id" in pts else None for k in (i, j))
        if a is not None and b is not None:
            return versus(a, b).verdict
        x, y = pts.loc[i], pts.loc[j]
        if pd.notna(x["maua_low"]) and pd.notna(y["maua_low"]):
            return "ahead" if x["maua_low"] > y["maua_high"] else "behind" if x["maua_high"] < y["maua_low"] else "tied"
        return "ahead" if x["maua"] > y["maua"] else "behind" if x["maua"] < y["maua"] else "tied"

    n = len(pts)
    cheaper = [[j for j in range(n) if j != i and pts.at[j, "bytes"] <= pts.at[i, "bytes"]] for i in range(n)]
    # the likeliest winner first (the highest MAUA): most runs off the frontier take one comparison
    beaten = [any(verdict(j, i) == "ahead" for j in sorted(cheaper[i], key=lambda j: -pts.at[j, "maua"]))
              for i in range(n)]
    pts["frontier"] = [not b for b in beaten]
    on = [i for i in range(n) if not beaten[i]]
    ties = {i: [pts.at[j, "run"] for j in on if j != i and verdict(i, j) == "tied"] for i in on}
    pts["tied"] = [bool(ties.get(i)) for i in range(n)]
    pts["tied_with"] = [", ".join(ties.get(i, [])) for i in range(n)]
    return pts.sort_values(["bytes", "maua"], ascending=[True, False], kind="stable").reset_index(drop=True)
