"""The Privacy tab's frames: each selected run's audit figures (the index's privacy table, read into
Snapshot.privacy) beside its MAUA with its 95% interval and its bytes, one frame per attack, and the table of every
figure as the report writes it (pipeline.results.privacy.format_privacy's cells). docs/privacy.md says what the
figures mean."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from dashboard.data.load import Snapshot
from dashboard.data.tables import accuracy_text, fmt_bytes
from dashboard.data.ties import run_intervals, series


@dataclass(frozen=True)
class Attack:
    """One scatter of the Privacy tab: the figures it draws (metric -> series name), and its baseline, what an
    attacker who ignores the uploads or the model scores: each run's own figure (a metric) or a constant."""
    title: str
    metrics: dict[str, str]
    axis: str  # the x axis' title
    baseline: str | float
    baseline_name: str
    digits: int  # decimals in tooltips and the table


ATTACKS = {
    "reconstruction": Attack("Reconstruction from the uploads: PSNR against MAUA", {"psnr": "reconstruction"},
                             "PSNR, dB (dashed: the mean public image)", "baseline_psnr",
                             "mean public image", 1),
    "membership": Attack("Membership inference on the final models: AUC against MAUA",
                         {"mia_auc": "loss threshold", "lira_auc": "LiRA"}, "membership AUC (dashed: chance, 0.5)",
                         0.5, "chance", 2),
    "label_mix": Attack("Label-mix inference from the uploads: TV distance against MAUA", {"label_tv": "label mix"},
                        "label-mix TV, 0 = exact (dashed: uniform guess)", "uniform_tv",
                        "uniform guess", 2),
}
PRIVACY_POINT_COLUMNS = ["run", "run_id", "algorithm", "attack", "metric", "series", "mean", "low", "high", "maua",
                 "maua_low", "maua_high", "bytes"]


def audited(snap: Snapshot, run_ids: list[str]) -> list[str]:
    """The runs (in the given order) that have audit figures."""
    have = set(snap.privacy["run_id"])
    return [r for r in dict.fromkeys(run_ids) if r in have]


def _accuracy_and_bytes(snap: Snapshot, run_ids: list[str], include_setup: bool) -> dict[str, dict]:
    """run_id -> its MAUA with the 95% interval over its clients (NaN bounds without one) and its bytes up + down to
    its last round (set-up traffic counted or not)."""
    out = {}
    for s in series(snap, run_ids):
        iv = run_intervals(s)
        out[s.run_id] = {"maua": s.maua, "maua_low": iv["maua_low"], "maua_high": iv["maua_high"],
                         "bytes": s.total_bytes if include_setup else s.total_bytes - s.setup_bytes}
    return out


def _figures(snap: Snapshot) -> dict[tuple[str, str], tuple]:
    """(run_id, metric) -> (mean, low, high) of the audited runs."""
    return {(r, m): (mean, low, high) for r, m, mean, low, high in snap.privacy[
        ["run_id", "metric", "mean", "low", "high"]].itertuples(index=False)}


def privacy_points(snap: Snapshot, run_ids: list[str], include_setup: bool = True) -> pd.DataFrame:
    """One row per audited run and figure an attack draws (ATTACKS): the figure's mean and 95% interval (low, high),
    the run's MAUA with its interval and its bytes. A run without rounds has NaN accuracy."""
    runs = audited(snap, run_ids)
    if not runs:
        return pd.DataFrame(columns=PRIVACY_POINT_COLUMNS)
    algo = snap.runs.set_index("run_id")["algorithm"]
    acc = _accuracy_and_bytes(snap, runs, include_setup)
    figures = _figures(snap)
    rows = []
    for attack, spec in ATTACKS.items():
        for run_id in runs:
            for metric, name in spec.metrics.items():
                if (run_id, metric) in figures:
                    mean, low, high = figures[(run_id, metric)]
                    rows.append({"run": snap.label(run_id), "run_id": run_id, "algorithm": algo.get(run_id),
                                 "attack": attack, "metric": metric, "series": name, "mean": mean, "low": low,
                                 "high": high, **acc.get(run_id, {})})
    df = pd.DataFrame(rows, columns=PRIVACY_POINT_COLUMNS)
    num = ["mean", "low", "high", "maua", "maua_low", "maua_high", "bytes"]
    df[num] = df[num].astype(float)
    return df


def privacy_baselines(snap: Snapshot, run_ids: list[str], attack: str) -> pd.DataFrame:
    """An attack's baseline as (run, baseline): each audited run's own figure (the mean public image, the uniform
    guess), or one row (run None) at a constant (chance)."""
    spec = ATTACKS[attack]
    if not isinstance(spec.baseline, str):
        return pd.DataFrame({"run": [None], "baseline": [float(spec.baseline)]})
    rows = snap.privacy[(snap.privacy["metric"] == spec.baseline) & snap.privacy["run_id"].isin(run_ids)]
    return pd.DataFrame({"run": [snap.label(r) for r in rows["run_id"]], "baseline": rows["mean"].astype(float)})


def figure_text(mean, low=None, high=None, digits: int = 2) -> str:
    """'13.2 [12.6, 13.9]' (as the report's privacy table writes a figure), 'n/a' without one."""
    if mean is None or pd.isna(mean):
        return "n/a"
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


# column -> (figure, decimals, its baseline in brackets after it): pipeline.results.privacy.format_privacy's columns
PRIVACY_TABLE_COLUMNS = {
    "reconstruction PSNR dB (mean image)": ("psnr", 1, "baseline_psnr"), "SSIM": ("ssim", 2, None),
    "MIA AUC (loss)": ("mia_auc", 2, None), "TPR @ 1% FPR": ("mia_tpr", 2, None),
    "MIA AUC (LiRA)": ("lira_auc", 2, None), "label-mix TV (uniform guess)": ("label_tv", 2, "uniform_tv")}


def privacy_table(snap: Snapshot, run_ids: list[str], include_setup: bool = True) -> pd.DataFrame:
    """Every audited run's figures as text, each with its 95% interval, as the report's privacy table writes them
    (a baseline in brackets after its figure; 'n/a' where the attack does not apply), then its MAUA and bytes."""
    runs = audited(snap, run_ids)
    acc = _accuracy_and_bytes(snap, runs, include_setup)
    figures = _figures(snap)
    rows = []
    for run_id in runs:
        row = {"run": snap.label(run_id)}
        for column, (metric, digits, base) in PRIVACY_TABLE_COLUMNS.items():
            row[column] = figure_text(*figures.get((run_id, metric), (None,)), digits=digits)
            if base and (run_id, base) in figures and row[column] != "n/a":
                row[column] += f" ({figures[(run_id, base)][0]:.{digits}f})"
        a = acc.get(run_id, {})
        row["MAUA"] = accuracy_text(a.get("maua"), a.get("maua_low"), a.get("maua_high"))
        row["bytes"] = fmt_bytes(a.get("bytes"))
        rows.append(row)
    return pd.DataFrame(rows, columns=["run", *PRIVACY_TABLE_COLUMNS, "MAUA", "bytes"])
