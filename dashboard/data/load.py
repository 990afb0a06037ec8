"""Reading the results files: the runs and one snapshot of the selected runs (no Streamlit). How a read opens the
files, and shares them with a training stage that writes them: dashboard.data.connect."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from datetime import datetime
from pathlib import Path

import duckdb
import pandas as pd

from dashboard.data.audit_rows import INDEX_CATALOG, PRIVACY_COLUMNS, read_privacy
from dashboard.data.connect import (NoResults, ResultsBusy, ResultsDamaged, ResultsUnavailable,  # noqa: F401
                                    connect_readonly, live_run_files, results_version)
from dashboard.data.sweeps import ablation_runs


def _runs_frame(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    # where the run ran (package versions, CPU/GPU, threads, the command), when the results file records it: an
    # optional JSON column, runs.environment (NULL, or no such column, in files that do not)
    columns = {d[0] for d in con.execute("SELECT * FROM runs LIMIT 0").description}
    environment = "r.environment::VARCHAR" if "environment" in columns else "NULL::VARCHAR"
    df = con.execute(
        "SELECT r.run_id, r.algorithm, r.dataset, r.setting, r.params, r.git_rev, r.started_at, r.finished_at, "
        "r.status, r.experiment, r.changed, r.label AS method_label, "  # (the frame's `label`: the legend's)
        f"{environment} AS environment, count(x.round) AS n_rounds, max(x.round) AS last_round, "
        "sum(x.wall_s) AS wall_total, max(x.wall_s) AS wall_max, max(f.seen_s) AS seen_s "
        "FROM runs r LEFT JOIN rounds x USING (run_id) LEFT JOIN file_seen f USING (run_id) "
        "GROUP BY ALL ORDER BY r.started_at, r.run_id").df()
    df["params"] = [json.loads(p) if isinstance(p, str) else (p or {}) for p in df["params"]]
    df["changed"] = [json.loads(c) if isinstance(c, str) else None for c in df["changed"]]
    df["environment"] = [_json_object(e) for e in df["environment"]]
    df["label"] = run_labels(df)
    df["status_shown"] = shown_status(df)
    df.attrs["next_stale"] = next_stale(df)  # when the page should look again though no file changed (app.watch)
    for key, path in SETUP_KEYS.items():
        df[key] = df["dataset"] if path is None else [_get(p, path) for p in df["params"]]
    return df.rename(columns={"wall_total": "wall_s"}).drop(columns=["wall_max", "seen_s"])


def _json_object(text) -> dict | None:
    """A JSON object from the results file, or None (NULL, not JSON, not an object)."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


STALE_AFTER_S = 10 * 60  # a 'running' run with no round for this long (and 3x its slowest round) was likely killed


def shown_status(runs: pd.DataFrame, now: datetime | None = None) -> list[str]:
    """The status to show: 'running' becomes 'stale (no round for N min)' when the last round is old.
    The last round is at least started_at + the rounds' wall_s (a resumed run: more), and at least
    when its per-run file last changed (read from such a file)."""
    now = now or datetime.now()  # started_at is local time (DuckDB's now() stored as TIMESTAMP)
    out = []
    for status, last, stale_at in zip(runs["status"], *_last_and_stale(runs)):
        if status != "running" or last is None or pd.Timestamp(now) <= stale_at:
            out.append(status)
            continue
        idle = (pd.Timestamp(now) - last).total_seconds()
        out.append(f"stale (no round for {int(idle // 60)} min)")
    return out


def _last_and_stale(runs: pd.DataFrame) -> tuple[list, list]:
    """Per run: when it last showed life (None: not running, or not started) and when, without another round, it is
    shown stale: after STALE_AFTER_S and 3x its slowest round."""
    lasts, stales = [], []
    for status, started, wall, slowest, seen in zip(runs["status"], runs["started_at"], runs["wall_total"],
                                                    runs["wall_max"], runs["seen_s"]):
        if status != "running" or pd.isna(started):
            lasts.append(None)
            stales.append(None)
            continue
        last = pd.Timestamp(started) + pd.Timedelta(seconds=0 if pd.isna(wall) else float(wall))
        if not pd.isna(seen):
            last = max(last, pd.Timestamp(datetime.fromtimestamp(seen)))
        lasts.append(last)
        stales.append(last + pd.Timedelta(seconds=max(STALE_AFTER_S, 3 * (0 if pd.isna(slowest) else slowest))))
    return lasts, stales


def next_stale(runs: pd.DataFrame, now: datetime | None = None) -> float | None:
    """When (epoch s) the next run shown 'running' turns 'stale' unless it writes a round; None: none will."""
    now = pd.Timestamp(now or datetime.now())
    ahead = [t for t in _last_and_stale(runs)[1] if t is not None and t >= now]
    return min(ahead).to_pydatetime().timestamp() if ahead else None


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


ROUND_COLUMNS = ["run_id", "round", "mean_acc", "bytes_up", "bytes_down", "wall_s", "sim_time_s"]
CLIENT_COLUMNS = ["run_id", "round", "client_id", "acc", "n_test", "val_acc", "n_val"]  # val: the validation split
WAITING_COLUMNS = ["run_id", "busy_s", "client_s"]  # the waiting share's figures summed per run (docs/devices.md)
METRIC_COLUMNS = ["run_id", "round", "name", "value"]
# What FedCache's server records per evaluated round about its knowledge cache (pipeline/methods/fedcache):
# the share of samples with a teacher, the mean age (rounds) of the knowledge teachers are built from, the
# share of teachers whose argmax is the label, and their mean entropy (nats). The Cache tab draws them.
CACHE_METRICS = ("cache_coverage", "cache_staleness", "cache_teacher_acc", "cache_teacher_entropy")


# the peers' payloads as their receivers' downloads (`cols`: the round, or the receiver as client_id)
RECEIVED = ("SELECT run_id, {cols}, 'down' AS direction, kind, sum(bytes)::BIGINT AS bytes, true AS received FROM comm "
            "WHERE run_id IN ({{q}}) AND direction = 'up' AND peer_id >= 0 GROUP BY ALL")


@dataclass
class Snapshot:
    """Everything the live views show, read in one connection."""
    runs: pd.DataFrame  # every run in the DB (see load_runs)
    rounds: pd.DataFrame  # run_id, round, mean_acc, bytes_up, bytes_down, wall_s (selected runs)
    clients: pd.DataFrame  # run_id, round, client_id, acc, n_test, val_acc, n_val
    # run_id, round, direction, kind, bytes (summed over clients), received: True for the "down" rows that are a
    # peer's "up" rows seen from the receiving client (decentralized methods: the same bytes, counted once in totals)
    comm_rounds: pd.DataFrame
    comm_clients: pd.DataFrame  # run_id, client_id, direction, kind, bytes (summed over rounds), received
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
    # the selected runs' privacy figures (read_privacy; a run without an audit has no rows), and whether the index has
    # the table at all (False: built before the audit, or no index read)
    privacy: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PRIVACY_COLUMNS))
    privacy_indexed: bool = False

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

        def read(table: str, sql: str, columns: list[str], twice: bool = False) -> pd.DataFrame:
            if not ids:
                return pd.DataFrame(columns=columns)
            return con.execute(sql.format(q=q), ids * (2 if twice else 1)).df()

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
        # a decentralized method's payload (pDFL's) is one ledger row, "up" for its sender with the receiving client as
        # peer_id (pipeline/federation/ledger.py): read back as that client's "down" too, flagged `received`
        comm_rounds = read("comm", f"SELECT run_id, round, direction, kind, sum(bytes)::BIGINT AS bytes, false AS received "
                           f"FROM comm WHERE run_id IN ({{q}}) GROUP BY ALL UNION ALL {RECEIVED.format(cols='round')} "
                           "ORDER BY ALL", ["run_id", "round", "direction", "kind", "bytes", "received"], twice=True)
        comm_clients = read("comm", f"SELECT run_id, client_id, direction, kind, sum(bytes)::BIGINT AS bytes, false AS "
                            f"received FROM comm WHERE run_id IN ({{q}}) GROUP BY ALL UNION ALL "
                            f"{RECEIVED.format(cols='peer_id AS client_id')} ORDER BY ALL",
                            ["run_id", "client_id", "direction", "kind", "bytes", "received"], twice=True)
        names = ", ".join(f"'{n}'" for n in CACHE_METRICS)
        metrics = read("round_metrics", f"SELECT run_id, round, name, value FROM round_metrics WHERE run_id IN ({{q}}) "
                       f"AND name IN ({names}) ORDER BY run_id, round, name", METRIC_COLUMNS)
        waiting = read("round_metrics", "SELECT run_id, sum(value) FILTER (WHERE name = 'sim_busy_s') AS busy_s, "
                       "sum(value) FILTER (WHERE name = 'sim_client_s') AS client_s FROM round_metrics "
                       "WHERE run_id IN ({q}) AND name IN ('sim_busy_s', 'sim_client_s') GROUP BY run_id",
                       WAITING_COLUMNS)
        cache_runs = [r for (r,) in con.execute("SELECT DISTINCT run_id FROM round_metrics WHERE name = ?",
                                                [CACHE_METRICS[0]]).fetchall()]
        privacy = read_privacy(con, ids, INDEX_CATALOG)
    # keep the caller's run order in every frame (legends, table rows)
    order = {r: i for i, r in enumerate(ids)}
    frames = []
    for df in (rounds, clients, comm_rounds, comm_clients, metrics,
               pd.DataFrame(columns=PRIVACY_COLUMNS) if privacy is None else privacy):
        df = df.sort_values("run_id", key=lambda s: s.map(order), kind="stable").reset_index(drop=True)
        frames.append(df)
    recorded = set(cache_runs)
    return Snapshot(runs, *frames[:4], ablation_rounds=ablation_rounds, ablation_clients=ablation_clients,
                    metrics=frames[4], cache_runs=[r for r in runs["run_id"] if r in recorded],  # oldest first
                    waiting=waiting, privacy=frames[5], privacy_indexed=privacy is not None)
