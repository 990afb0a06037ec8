"""The Ablations tab's charts: MAUA and bytes against a swept param's values, one line per method (the FedCache
paper's Figs. 6 and 7), in the colours and dashes of dashboard.charts."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.charts import HEIGHT, decades_of, log_bytes_y, run_color, run_dash, wrapped_title


def _swept_x(points: pd.DataFrame, key: str) -> alt.X:
    """The swept values, each a tick: a log axis when they are positive numbers spanning a decade or more
    (R 1-256, alpha 1-10, data shares 0.33-20 %: the paper's figures space them evenly), else linear;
    names (an encoder) as categories in the sweep's order."""
    values = list(dict.fromkeys(points["value"]))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return alt.X("value:N", title=key, sort=[str(v) for v in values], axis=alt.Axis(labelAngle=0))
    log = min(values) > 0 and max(values) >= 10 * min(values)
    return alt.X("value:Q", title=f"{key}{' (log)' if log else ''}", axis=alt.Axis(values=values, format="~g"),
                 scale=alt.Scale(type="log" if log else "linear", nice=False, zero=False, padding=12))


def _ablation_lines(points: pd.DataFrame) -> dict[str, str]:
    """line label -> method, for the colour (and, when an ablation has both settings, dash) scales."""
    return dict(zip(points["line"], points["algorithm"]))


ABLATION_TIP = ["line", "value", alt.Tooltip("maua:Q", format=".2%", title="MAUA"),
                alt.Tooltip("maua_low:Q", format=".2%", title="95% low"),
                alt.Tooltip("maua_high:Q", format=".2%", title="95% high"),
                alt.Tooltip("bytes:Q", format=",", title="bytes"), alt.Tooltip("seeds:Q", title="seeds"), "runs"]


def ablation_maua(points: pd.DataFrame, key: str) -> alt.Chart:
    """MAUA against the swept value, one line per method in its colour (the paper's Figs. 6 and 7), each point
    with its 95% interval as an error bar: two values whose bars overlap may well be tied."""
    points = points.dropna(subset=["maua"]).assign(value=lambda d: d["value"].map(_plain))
    lines = _ablation_lines(points)
    base = alt.Chart(points).encode(
        x=_swept_x(points, key), color=run_color(lines, field="line", title="method"))
    line = base.mark_line(point=True).encode(
        y=alt.Y("maua:Q", title="MAUA (95% interval)", scale=alt.Scale(zero=False), axis=alt.Axis(format="%")),
        strokeDash=run_dash(lines, field="line", title="method"), tooltip=ABLATION_TIP)
    bars = base.transform_filter("isValid(datum.maua_low)").mark_rule(opacity=0.6).encode(
        y="maua_low:Q", y2="maua_high:Q", tooltip=ABLATION_TIP)
    return alt.layer(line, bars).properties(title=wrapped_title(f"MAUA vs {key}"), height=HEIGHT)


def ablation_bytes(points: pd.DataFrame, key: str) -> alt.Chart:
    """Bytes communicated (to each run's last round) against the swept value on a log axis, one line per
    method; methods that send nothing are left out (a log axis has no 0)."""
    points = points[points["bytes"] > 0].assign(value=lambda d: d["value"].map(_plain))
    lines = _ablation_lines(points)
    return alt.Chart(points, title=wrapped_title(f"Bytes communicated vs {key}")).mark_line(point=True).encode(
        x=_swept_x(points, key), y=log_bytes_y(decades_of(points["bytes"]), "bytes, up + down (log)"),
        color=run_color(lines, field="line", title="method"), strokeDash=run_dash(lines, field="line", title="method"),
        tooltip=ABLATION_TIP,
    ).properties(height=HEIGHT)


def _plain(value):
    """A swept value as the chart takes it: numbers as floats, anything else as its text."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
