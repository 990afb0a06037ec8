"""Reading the results for the dashboard: pure functions, no Streamlit.

The results are the index `results/results.duckdb` (rebuilt by the report stage) and each
training stage's own `results/runs/<name>/run.duckdb` (pipeline.results). A read takes the index
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
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import duckdb
import pandas as pd

from pipeline import paths
from pipeline.compare import RunSeries, comparison
from pipeline.results import RUN_SCHEMA, TABLES, ResultsError, ResultsLocked, attach, fix, run_files


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


def _combine(con: duckdb.DuckDBPyConnection, index: str | None, live: list[str]) -> None:
    """Temp views runs/rounds/... over the attached catalogs: the index's rows of the runs no live
    file holds, then every live file's rows (an empty typed table underneath gives every column)."""
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


@contextmanager
def connect_readonly(path: Path, timeout_s: float = 2.0, poll_s: float = 0.05,
                     runs_dir: Path | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection whose views combine the index `path` and its live per-run files (runs_dir,
    default <index dir>/runs), attached read-only and retried while a writer holds one; closed on exit."""
    path = Path(path)
    runs_dir = Path(runs_dir) if runs_dir is not None else path.parent / paths.RUNS.name
    live = live_run_files(path, runs_dir)
    if not path.is_file() and not live:
        raise NoResults(f"No results database at `{path}` yet (nor per-run results in `{runs_dir}`). Run the "
                        "pipeline first (`make run`), or point the dashboard at one with FEDCACHE_RESULTS_DB / "
                        "--results-db.")
    deadline = time.monotonic() + timeout_s
    con = duckdb.connect()
    files = ([path] if path.is_file() else []) + live
    try:
        index, fresh = None, []
        for i, f in enumerate(files):
            try:
                if not attach(con, f, f"src{i}", max(0.0, deadline - time.monotonic()), poll_s):
                    continue  # gone meanwhile (a new run replacing its file)
            except ResultsLocked as err:
                raise ResultsBusy(f"`{f}` is locked by a writer (a training round): {err.why}") from err
            except ResultsError as err:
                raise ResultsDamaged(f"`{f}` is damaged or not a results file ({err.why}). To make it again, "
                                     f"{fix(f)}.") from err
            if f == path:
                index = f"src{i}"
            else:
                fresh.append(f"src{i}")
        _combine(con, index, fresh)
        try:
            yield con
        except duckdb.Error as err:  # a file whose header reads but whose data does not
            names = ", ".join(f"`{f}`" for f in files)
            raise ResultsDamaged(f"Reading {names} failed ({str(err).splitlines()[0]}). To make the index again, "
                                 f"{fix(path)}; a per-run file: re-run its stage.") from err
    finally:
        con.close()


def _runs_frame(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    df = con.execute(
        "SELECT r.run_id, r.algorithm, r.dataset, r.setting, r.params, r.git_rev, r.started_at, r.finished_at, "
        "r.status, r.experiment, r.changed, count(x.round) AS n_rounds, max(x.round) AS last_round "
        "FROM runs r LEFT JOIN rounds x USING (run_id) GROUP BY ALL ORDER BY r.started_at, r.run_id").df()
    df["params"] = [json.loads(p) if isinstance(p, str) else (p or {}) for p in df["params"]]
    df["changed"] = [json.loads(c) if isinstance(c, str) else None for c in df["changed"]]
    df["label"] = run_labels(df)
    return df


def run_labels(runs: pd.DataFrame) -> list[str]:
    """Short unique names for legends: 'fedcache/homo d663c8', or with the DVC experiment the run
    belongs to (a sweep's): 'fedcache/homo paper_ablations-R-16'."""
    experiments = runs["experiment"] if "experiment" in runs else [None] * len(runs)
    labels = [f"{a}/{s} {e if isinstance(e, str) and e else str(r)[-6:]}"
              for a, s, r, e in zip(runs["algorithm"], runs["setting"], runs["run_id"], experiments)]
    return [lab if labels.count(lab) == 1 else str(r) for lab, r in zip(labels, runs["run_id"])]


def load_runs(path: Path, timeout_s: float = 2.0, runs_dir: Path | None = None) -> pd.DataFrame:
    """All runs (one row each, params parsed, with n_rounds/last_round and a legend label)."""
    with connect_readonly(path, timeout_s, runs_dir=runs_dir) as con:
        return _runs_frame(con)


def default_selection(runs: pd.DataFrame) -> list[str]:
    """Per (algorithm, setting): the latest run that has written a round (else the latest run)."""
    if runs.empty:
        return []
    ranked = runs.assign(_has=runs["n_rounds"].fillna(0) > 0).sort_values(["_has", "started_at", "run_id"])
    latest = ranked.groupby(["algorithm", "setting"], sort=False).tail(1)
    return latest.sort_values(["setting", "algorithm"])["run_id"].tolist()


@dataclass
class Snapshot:
    """Everything the live views show, read in one connection."""
    runs: pd.DataFrame  # every run in the DB (see load_runs)
    rounds: pd.DataFrame  # run_id, round, mean_acc, bytes_up, bytes_down, wall_s (selected runs)
    clients: pd.DataFrame  # run_id, round, client_id, acc, n_test
    comm_rounds: pd.DataFrame  # run_id, round, direction, kind, bytes (summed over clients)
    comm_clients: pd.DataFrame  # run_id, client_id, direction, kind, bytes (summed over rounds)
    read_at: float = field(default_factory=time.time)

    def label(self, run_id: str) -> str:
        hit = self.runs.loc[self.runs["run_id"] == run_id, "label"]
        return hit.iloc[0] if len(hit) else run_id


def load_snapshot(path: Path, run_ids: list[str], timeout_s: float = 2.0, runs_dir: Path | None = None) -> Snapshot:
    ids = list(dict.fromkeys(run_ids))
    with connect_readonly(path, timeout_s, runs_dir=runs_dir) as con:
        runs = _runs_frame(con)
        q = ", ".join("?" * len(ids)) or "NULL"

        def read(table: str, sql: str, columns: list[str]) -> pd.DataFrame:
            if not ids:
                return pd.DataFrame(columns=columns)
            return con.execute(sql.format(q=q), ids).df()

        rounds = read("rounds", "SELECT run_id, round, mean_acc, bytes_up, bytes_down, wall_s FROM rounds "
                      "WHERE run_id IN ({q}) ORDER BY run_id, round",
                      ["run_id", "round", "mean_acc", "bytes_up", "bytes_down", "wall_s"])
        clients = read("client_rounds", "SELECT run_id, round, client_id, acc, n_test FROM client_rounds "
                       "WHERE run_id IN ({q}) ORDER BY run_id, round, client_id",
                       ["run_id", "round", "client_id", "acc", "n_test"])
        comm_rounds = read("comm", "SELECT run_id, round, direction, kind, sum(bytes)::BIGINT AS bytes FROM comm "
                           "WHERE run_id IN ({q}) GROUP BY ALL ORDER BY ALL",
                           ["run_id", "round", "direction", "kind", "bytes"])
        comm_clients = read("comm", "SELECT run_id, client_id, direction, kind, sum(bytes)::BIGINT AS bytes FROM comm "
                            "WHERE run_id IN ({q}) GROUP BY ALL ORDER BY ALL",
                            ["run_id", "client_id", "direction", "kind", "bytes"])
    # keep the caller's run order in every frame (legends, table rows)
    order = {r: i for i, r in enumerate(ids)}
    frames = []
    for df in (rounds, clients, comm_rounds, comm_clients):
        df = df.sort_values("run_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
        frames.append(df)
    return Snapshot(runs, *frames)


# ----------------------------------------------------------------------------- derived views

def series(snap: Snapshot, run_ids: list[str]) -> list[RunSeries]:
    """pipeline.compare.RunSeries of the runs that have rounds, in the given order."""
    meta = snap.runs.set_index("run_id")
    out = []
    for run_id in run_ids:
        rows = snap.rounds[snap.rounds["run_id"] == run_id]
        if rows.empty or run_id not in meta.index:
            continue
        out.append(RunSeries(run_id, meta.at[run_id, "algorithm"], meta.at[run_id, "setting"], [
            (int(r), None if pd.isna(a) else float(a), int(u), int(d))
            for r, a, u, d in zip(rows["round"], rows["mean_acc"], rows["bytes_up"], rows["bytes_down"])]))
    return out


def default_target(runs: list[RunSeries], snap: Snapshot | None = None) -> float:
    """The report's target (`report.target_acc` for the dataset, from the first shown run's params),
    so the table matches results/report/comparison.md; else one every shown run reaches: the
    lowest MAUA, rounded down to a percent."""
    if snap is not None and runs:
        hit = snap.runs.loc[snap.runs["run_id"] == runs[0].run_id, "params"]
        params = hit.iloc[0] if len(hit) else {}
        target = params.get("report", {}).get("target_acc", {}).get(params.get("data", {}).get("dataset"))
        if isinstance(target, (int, float)) and 0 < target <= 1:
            return float(target)
    mauas = [s.maua for s in runs if s.maua is not None]
    return math.floor(min(mauas) * 100) / 100 if mauas else 0.5


def comparison_frame(snap: Snapshot, run_ids: list[str], target: float, include_setup: bool = True) -> pd.DataFrame:
    rows = comparison(series(snap, run_ids), target, include_setup)
    df = pd.DataFrame(rows, columns=["algorithm", "setting", "run_id", "rounds", "maua", "final_acc", "bytes_total",
                                     "bytes_setup", "bytes_training", "target_acc", "bytes_to_target", "speedup"])
    status = snap.runs.set_index("run_id")["status"]
    df.insert(3, "status", [status.get(r, "") for r in df["run_id"]])
    df.insert(0, "run", [snap.label(r) for r in df["run_id"]])
    return df


def accuracy_curves(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Per run and evaluated round: mean accuracy and cumulative bytes (up + down) so far."""
    if snap.rounds.empty:
        return pd.DataFrame(columns=["run", "run_id", "round", "mean_acc", "cum_bytes"])
    df = snap.rounds.copy()
    per_round = df["bytes_up"].astype("int64") + df["bytes_down"].astype("int64")
    if not include_setup:
        per_round = per_round.where(df["round"] > 0, 0)
    df["cum_bytes"] = per_round.groupby(df["run_id"]).cumsum()
    df["run"] = [snap.label(r) for r in df["run_id"]]
    df = df.dropna(subset=["mean_acc"])
    return df[["run", "run_id", "round", "mean_acc", "cum_bytes"]].reset_index(drop=True)


def best_round_clients(snap: Snapshot) -> pd.DataFrame:
    """Every client's accuracy at its run's best round (the round of the MAUA)."""
    cols = ["run", "run_id", "round", "client_id", "acc", "n_test"]
    evaluated = snap.rounds.dropna(subset=["mean_acc"])
    if evaluated.empty or snap.clients.empty:
        return pd.DataFrame(columns=cols)
    best = evaluated.loc[evaluated.groupby("run_id", sort=False)["mean_acc"].idxmax(), ["run_id", "round"]]
    df = snap.clients.merge(best, on=["run_id", "round"])
    df["run"] = [snap.label(r) for r in df["run_id"]]
    return df[cols].reset_index(drop=True)


def client_history(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = snap.clients[snap.clients["client_id"] == client_id].copy()
    df["run"] = [snap.label(r) for r in df["run_id"]]
    return df[["run", "run_id", "round", "acc", "n_test"]].reset_index(drop=True)


def client_bytes(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = snap.comm_clients[snap.comm_clients["client_id"] == client_id].copy()
    df["run"] = [snap.label(r) for r in df["run_id"]]
    return df[["run", "direction", "kind", "bytes"]].reset_index(drop=True)


def bytes_by_kind(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Total bytes per run, direction and kind (the stacked bars)."""
    df = snap.comm_rounds
    if not include_setup:
        df = df[df["round"] > 0]
    if df.empty:
        return pd.DataFrame(columns=["run", "direction", "kind", "traffic", "bytes"])
    out = df.groupby(["run_id", "direction", "kind"], sort=False, as_index=False)["bytes"].sum()
    out["run"] = [snap.label(r) for r in out["run_id"]]
    out["traffic"] = out["direction"] + " · " + out["kind"]
    return out[["run", "direction", "kind", "traffic", "bytes"]]


def bytes_per_round(snap: Snapshot, run_id: str) -> pd.DataFrame:
    df = snap.comm_rounds[snap.comm_rounds["run_id"] == run_id].copy()
    df["traffic"] = df["direction"] + " · " + df["kind"]
    return df[["round", "direction", "kind", "traffic", "bytes"]].reset_index(drop=True)
