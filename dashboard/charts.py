"""Altair charts over the frames of dashboard.data / dashboard.stages (no Streamlit here)."""

from __future__ import annotations

import altair as alt
import pandas as pd

HEIGHT = 420  # the whole chart (title, axes and legend included), as Streamlit sizes it


def run_color(domain: list[str] | None = None, legend: bool = True) -> alt.Color:
    """One colour per run, the same in every chart when given the same domain (all shown runs)."""
    scale = alt.Scale(scheme="tableau10", domain=domain) if domain else alt.Scale(scheme="tableau10")
    return alt.Color("run:N", title="run", scale=scale,
                     legend=alt.Legend(orient="bottom", columns=2, labelLimit=260) if legend else None)


def accuracy_vs_round(curves: pd.DataFrame, runs: list[str] | None = None) -> alt.Chart:
    return alt.Chart(curves, title="Mean user accuracy vs round").mark_line(point=True).encode(
        x=alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("mean_acc:Q", title="mean user accuracy", scale=alt.Scale(zero=False), axis=alt.Axis(format="%")),
        color=run_color(runs),
        tooltip=["run", "round", alt.Tooltip("mean_acc:Q", format=".2%"), alt.Tooltip("cum_bytes:Q", format=",")],
    ).properties(height=HEIGHT)


def accuracy_vs_bytes(curves: pd.DataFrame, zero_byte_runs: pd.DataFrame,
                      runs: list[str] | None = None) -> alt.LayerChart | alt.Chart:
    """Log-x lines; runs that send nothing (cumulative 0 B) become dashed rules at their MAUA."""
    sent = curves[curves["cum_bytes"] > 0]
    title = "Mean user accuracy vs cumulative bytes (up + down)"
    base = alt.Chart(sent).mark_line(point=True).encode(
        x=alt.X("cum_bytes:Q", title="cumulative bytes (log)", scale=alt.Scale(type="log", nice=False),
                axis=alt.Axis(format="~s")),
        y=alt.Y("mean_acc:Q", title="mean user accuracy", scale=alt.Scale(zero=False), axis=alt.Axis(format="%")),
        color=run_color(runs),
        tooltip=["run", "round", alt.Tooltip("mean_acc:Q", format=".2%"), alt.Tooltip("cum_bytes:Q", format=",")],
    ).properties(height=HEIGHT)
    if zero_byte_runs.empty:
        return base.properties(title=title)
    rules = alt.Chart(zero_byte_runs).mark_rule(strokeDash=[6, 4]).encode(
        y="maua:Q", color=run_color(runs), tooltip=["run", alt.Tooltip("maua:Q", format=".2%", title="MAUA (0 bytes)")])
    return alt.layer(base, rules).properties(title=title)


def client_spread(best: pd.DataFrame, runs: list[str] | None = None) -> alt.Chart:
    """Horizontal boxes (min-max whiskers), one per run, so long run names stay readable."""
    return alt.Chart(best, title="Per-client accuracy at each run's best round").mark_boxplot(
        extent="min-max", size=22).encode(
        y=alt.Y("run:N", title=None, sort=runs, axis=alt.Axis(labelLimit=260)),
        x=alt.X("acc:Q", title="client accuracy", axis=alt.Axis(format="%")),
        color=run_color(runs, legend=False),
    ).properties(height=max(120, 48 * best["run"].nunique()))


def client_accuracy(history: pd.DataFrame, client_id: int, runs: list[str] | None = None) -> alt.Chart:
    return alt.Chart(history, title=f"Client {client_id}: accuracy vs round").mark_line(point=True).encode(
        x=alt.X("round:Q", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("acc:Q", title="accuracy", scale=alt.Scale(zero=False), axis=alt.Axis(format="%")),
        color=run_color(runs), tooltip=["run", "round", alt.Tooltip("acc:Q", format=".2%"), "n_test"],
    ).properties(height=260)


def bytes_stacked(df: pd.DataFrame, x: str = "run:N", title: str = "Bytes by kind and direction") -> alt.Chart:
    return alt.Chart(df, title=title).mark_bar().encode(
        x=alt.X(x, title=None if x.startswith("run") else x.split(":")[0],
                axis=alt.Axis(labelAngle=0, labelLimit=200)),
        y=alt.Y("sum(bytes):Q", title="bytes", stack="zero", axis=alt.Axis(format="~s")),
        color=alt.Color("traffic:N", title="direction · kind", legend=alt.Legend(orient="bottom")),
        tooltip=["traffic", alt.Tooltip("sum(bytes):Q", format=",", title="bytes")],
    ).properties(height=HEIGHT)


def label_heatmap(mix: pd.DataFrame) -> alt.Chart:
    return alt.Chart(mix, title="Training label mix per client").mark_rect().encode(
        x=alt.X("class:N", sort=alt.SortField("class_id"), title=None, axis=alt.Axis(labelAngle=-30)),
        y=alt.Y("client_id:O", title="client"),
        color=alt.Color("count:Q", title="samples", scale=alt.Scale(scheme="blues")),
        tooltip=["client_id", "class", "count", alt.Tooltip("share:Q", format=".1%"), "test_count"],
    ).properties(height=max(200, 14 * mix["client_id"].nunique()))
