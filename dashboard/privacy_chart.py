"""The Privacy tab's scatter: what an attack learns from each run against the run's accuracy, a point per audited run
(dashboard.data.privacy_points) in its method's colour, with both 95% intervals as error bars, and the attack's
baseline (what an attacker who ignores the uploads or the model scores) as a dashed rule."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.charts import HEIGHT, LABEL_LIMIT, _runs_of, legend_columns, run_color, wrapped_title
from dashboard.data.privacy import ATTACKS

SERIES_SHAPES = ["circle", "square", "triangle-up"]  # an attack's series (the loss threshold, LiRA) in this order
BASELINE_COLOR = "#555"


def privacy_scatter(points: pd.DataFrame, baselines: pd.DataFrame, attack: str,
                    runs: dict[str, str] | None = None) -> alt.LayerChart:
    """One attack (dashboard.data.ATTACKS) of the runs in `points` (privacy_points' rows of that attack): x its
    figure with the 95% interval over the audited clients as a horizontal bar, y the run's MAUA with its interval over
    its clients as a vertical bar (where it has one), the run's bytes in the tooltip. Two figures of one attack
    (membership: the loss threshold and LiRA) are two point shapes on the run's line. `baselines`
    (privacy_baselines): dashed rules, one per run's own baseline or one at a constant."""
    spec = ATTACKS[attack]
    runs = _runs_of(points, runs)
    fmt = f".{spec.digits}f"
    # a TV distance from 0 (the exact mix); the others with a little room at the ends, off a baseline on the edge
    x = alt.X("mean:Q", title=spec.axis, scale=alt.Scale(zero=True) if attack == "label_mix" else
              alt.Scale(zero=False, padding=14))
    y = alt.Y("maua:Q", title="MAUA (bars: 95% intervals)", scale=alt.Scale(zero=False), axis=alt.Axis(format="%"))
    tips = [alt.Tooltip("run:N"), alt.Tooltip("series:N", title="attack"),
            alt.Tooltip("mean:Q", format=fmt, title="figure"), alt.Tooltip("low:Q", format=fmt, title="95% from"),
            alt.Tooltip("high:Q", format=fmt, title="95% to"), alt.Tooltip("maua:Q", format=".2%", title="MAUA"),
            alt.Tooltip("maua_low:Q", format=".2%", title="MAUA 95% from"),
            alt.Tooltip("maua_high:Q", format=".2%", title="MAUA 95% to"),
            alt.Tooltip("bytes:Q", format=",", title="bytes (B, up + down)")]
    color = run_color(runs, alt.Legend(orient="bottom", columns=legend_columns(runs), labelLimit=LABEL_LIMIT,
                                       symbolType="circle"))
    shown = points.dropna(subset=["mean", "maua"])
    names = list(spec.metrics.values())
    shape = alt.Shape("series:N", title="attack", sort=names, scale=alt.Scale(
        domain=names, range=SERIES_SHAPES[:len(names)]), legend=alt.Legend(orient="top", labelLimit=LABEL_LIMIT)
        if len(names) > 1 else None)
    across = alt.Chart(shown.dropna(subset=["low", "high"])).mark_rule(strokeWidth=1.5, opacity=0.7).encode(
        x=alt.X("low:Q", title=spec.axis), x2=alt.X2("high:Q"), y=y, color=color, tooltip=tips)
    up = alt.Chart(shown.dropna(subset=["maua_low", "maua_high"])).mark_rule(strokeWidth=1.5, opacity=0.7).encode(
        x=x, y=alt.Y("maua_low:Q", title="MAUA (bars: 95% intervals)"), y2=alt.Y2("maua_high:Q"), color=color, tooltip=tips)
    dots = alt.Chart(shown).mark_point(size=110, strokeWidth=2, filled=True, opacity=1).encode(
        x=x, y=y, color=color, shape=shape, tooltip=tips)
    rule = alt.Chart(baselines.assign(name=spec.baseline_name)).mark_rule(
        strokeDash=[6, 4], color=BASELINE_COLOR).encode(
        x=alt.X("baseline:Q", title=spec.axis),
        tooltip=[alt.Tooltip("name:N", title="baseline"), *([alt.Tooltip("run:N")] if baselines["run"].notna().any()
                                                             else []),
                 alt.Tooltip("baseline:Q", format=fmt, title="figure")])
    return alt.layer(rule, across, up, dots).properties(title=wrapped_title(spec.title), height=HEIGHT)
