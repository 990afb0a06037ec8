"""The comparison and paper tables as the dashboard shows them: frames, text with intervals, sortable
styled tables with the best (or tied leaders) marked, and their CSV."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd

from dashboard.data.load import Snapshot
from dashboard.data.ties import run_intervals, series
from pipeline.results.compare import RunSeries, comparison
from pipeline.results.intervals import Interval, percent

if TYPE_CHECKING:
    from pandas.io.formats.style import Styler


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


PAPER_SHOWN = ["maua", "paper_maua", "difference", "gb_total", "gb_to_target", "paper_gb", "speedup", "paper_speedup"]


def paper_display(frame: pd.DataFrame) -> pd.DataFrame:
    """paper_frame for people: percentages, bytes in KB/MB/GB (the paper's GB as GB), speed-ups as '12.3x', and
    '—' with the reason where there is no number."""
    shown = frame.copy().reset_index(drop=True).drop(columns=["speedup_why"])

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
    return shown


def sortable_paper_table(frame: pd.DataFrame) -> Styler:
    """paper_display's text over paper_frame's numbers, each column sorting by its number; bytes to the target
    'not reached' as +inf (after every number). A missing figure stays empty (NaN): the grid draws its
    placeholder there, whatever the text."""
    values = frame.reset_index(drop=True).copy()
    for col in PAPER_SHOWN:
        values[col] = pd.to_numeric(values[col], errors="coerce").astype(float)
    values["gb_to_target"] = values["gb_to_target"].fillna(math.inf)
    return shown_as(values.drop(columns=["speedup_why"]), paper_display(frame), PAPER_SHOWN)


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
