"""Runs that differ only in their seed, as one group: curves, tables, method rows and paired differences
over the seeds."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd

from dashboard.data.load import Snapshot
from dashboard.data.select import seed_key, seed_of
from dashboard.data.tables import NOT_REACHED, accuracy_text, fmt_bytes, shown_as, speedup_sort_values, vs_texts
from dashboard.data.ties import remembered, series, series_fingerprint
from pipeline.results import compare
from pipeline.results.compare import RunSeries, difference_interval
from pipeline.results.intervals import percent

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


# ----------------------------------------------------------------------------- seeds as groups

def seed_groups(runs: pd.DataFrame) -> pd.Series:
    """A group label per run (same index): runs of one algorithm and setting whose params differ only
    in the top-level `seed` form a group, labelled by its first run's label plus '(n seeds)' when
    n > 1 ('(n runs)' when some share a seed: repeats)."""
    if runs.empty:
        return pd.Series([], index=runs.index, dtype=object)
    key = seed_key(runs)
    first = runs["label"].groupby(key, sort=False).transform("first")
    size = key.map(key.value_counts())
    seeds = pd.Series([seed_of(p) for p in runs["params"]], index=runs.index).groupby(key).transform("nunique")
    return pd.Series([f if n == 1 else f"{f} ({n} seeds)" if k == n else f"{f} ({n} runs)"
                      for f, n, k in zip(first, size, seeds)], index=runs.index, dtype=object)


def has_seed_groups(runs: pd.DataFrame) -> bool:
    """Whether 2+ of these runs differ only in their seed (the 'Group seeds' toggle's default)."""
    if runs.empty:
        return False
    seeds = pd.Series([seed_of(p) for p in runs["params"]], index=runs.index)
    return bool((seeds.groupby(seed_key(runs)).nunique() > 1).any())


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

    return remembered(("resampled", series_fingerprint(s)), compute)


def _key(runs: list[RunSeries]) -> tuple:
    return tuple((s.name, s.algorithm, s.setting, s.seed, series_fingerprint(s)) for s in runs)


def method_rows(runs: list[RunSeries]) -> list[dict]:
    """pipeline.results.compare.method_rows (each name over its seeds, with 95% intervals), remembered."""
    return remembered(("methods", _key(runs)), lambda: compare.method_rows(runs))


def differences(runs: list[RunSeries]) -> list[dict]:
    """pipeline.results.compare.differences (every run or group against local-only and FedCache of its setting,
    paired, with "ahead" / "behind" / "tied"), remembered."""
    return remembered(("differences", _key(runs)), lambda: compare.differences(runs))


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
