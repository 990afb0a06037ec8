"""Each run as a pipeline.results.compare.RunSeries, its 95% intervals (remembered across refreshes), who
leads in MAUA counting ties, and the Pareto view that counts them."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import pandas as pd

from dashboard.data.load import Snapshot
from pipeline.results import compare
from pipeline.results.compare import RunSeries
from pipeline.results.compression import encoding_text
from pipeline.results.intervals import Interval, paired_difference, percent


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


def remembered(key: tuple, compute):
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


def series_fingerprint(s: RunSeries) -> tuple:
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

    return remembered(("run", series_fingerprint(s)), compute)


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

    diff = remembered(("pair", series_fingerprint(first), series_fingerprint(second)), compute)
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


def method_label(run: str) -> str:
    """What ran, read back from a run's name ('fedcache (encode_up=int8)/homo d663c8' -> 'fedcache
    (encode_up=int8)': load.run_labels writes '<method label>/<setting> <experiment or id>'); a name without
    '/' (a run id, when two names would be the same) as it is."""
    return run.rsplit("/", 1)[0]


def pareto_points(table: pd.DataFrame, include_setup: bool = True,
                  runs: list[RunSeries] | None = None, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """comparison_frame's runs as (run, algorithm, encoding, maua with maua_low/maua_high, bytes) placed against the
    accuracy-vs-bytes trade-off, counting ties. Bytes are the run's total up to its last round (set-up included
    or not): counted, exact. MAUA is an estimate with a 95% interval, so a run is beaten only when another run
    with no more bytes is ahead of it with an interval that excludes a tie (versus: the paired difference when
    the two can be paired, else their own intervals; with `runs` None, or a run without intervals, the
    intervals in the table, else the MAUAs themselves). Columns:
    `frontier`: no other run beats it so (on the frontier or its band);
    `tied`: on it, but tied in MAUA with another such run (the frontier's band: neither is the better);
    `tied_with`: those runs' names;
    `encoding`: how its payloads travel (pipeline.results.compression.encoding_text of what ran: "float32",
    "int8", "up int8, down float16"), from `labels` (run_id -> the run's method label, as runs.label stores it:
    'fedcache (consistency=round, encode_up=int8)') where it has the run, else from the run's name (method_label).
    Runs without a MAUA are left out."""
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
    labels = labels or {}
    ids = pts["run_id"] if "run_id" in pts else [None] * len(pts)
    pts.insert(pts.columns.get_loc("algorithm") + 1 if "algorithm" in pts else 1, "encoding", [
        encoding_text(labels[r] if isinstance(labels.get(r), str) and labels[r] else method_label(str(name)))
        for r, name in zip(ids, pts["run"])])
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
