"""The Ablations tab's points: per swept key, value and method, MAUA with its interval over seeds and bytes."""

from __future__ import annotations

import json
import math

import pandas as pd

from dashboard.data.load import Snapshot
from dashboard.data.sweeps import ablation_runs
from dashboard.data.ties import series
from pipeline.results.compare import RunSeries
from pipeline.results.intervals import run_interval


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
