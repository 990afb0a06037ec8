"""The Pareto chart: MAUA (with its 95% interval) against bytes, a point per run shaped by its payload encoding,
the frontier filled and joined by a staircase (dashboard/data/ties.py decides which runs are on it)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from dashboard.charts import BYTES_LABEL, HEIGHT, _runs_of, _stable, decades_of, run_color

ENCODING_SHAPES = {"float32": "circle", "float16": "diamond", "int8": "square", "argmax": "triangle-up",
                   "topk": "cross", "delta": "triangle-down"}
OTHER_SHAPES = ["triangle-right", "triangle-left", "wedge", "arrow"]


def encoding_shape(encoding: str) -> str:
    kind = str(encoding).split(":")[0]
    return ENCODING_SHAPES.get(kind) or _stable(encoding, OTHER_SHAPES)


def encoding_order(encodings) -> list[str]:
    """The encodings shown, as the shape legend lists them: float32 first, then from the most bytes a value to the
    fewest (ENCODING_SHAPES' order), mixed ones last, each kind's in the order met."""
    kinds = list(ENCODING_SHAPES)
    found = list(dict.fromkeys(str(e) for e in encodings))
    return sorted(found, key=lambda e: kinds.index(k) if (k := e.split(":")[0]) in kinds else len(kinds))


def encoding_shape_channel(encodings) -> alt.Shape:
    """Each encoding its point shape (encoding_shape); a legend titled "encoding" when the points have more than
    one (all float32, as before encodings, they stay plain circles with no legend). The legend stands right of the
    plot: beside the runs' legend under it, the two would be wider than the plot, which Vega then narrows."""
    domain = encoding_order(encodings)
    legend = alt.Legend(orient="right", title="encoding", labelLimit=160, symbolFillColor="#888",
                        symbolStrokeColor="#555") if len(domain) > 1 else None
    return alt.Shape("encoding:N", title="encoding", legend=legend,
                     scale=alt.Scale(domain=domain, range=[encoding_shape(e) for e in domain]))


POINT_LABEL_LIMIT = 170  # px: a point's label is cut ('…') past this, so long run names cannot squeeze the plot


def _point_names(points: pd.DataFrame) -> list[str]:
    """What a Pareto point is labelled: its run's name, or, when the runs differ in encoding, its method and
    encoding ("fedcache int8"): run names that spell out encode_* knobs are too long to sit beside a point (the
    legend and the lists beside the chart give them whole)."""
    if points["encoding"].nunique() > 1 and "algorithm" in points:
        return [f"{a} {e}" for a, e in zip(points["algorithm"], points["encoding"])]
    return list(points["run"])


def pareto(points: pd.DataFrame, runs: dict[str, str] | None = None) -> alt.LayerChart:
    """MAUA against bytes (log x), one point per run in its method's colour with its MAUA's 95% interval as an
    error bar (bytes are counted: no bar), in its encoding's shape (encoding_shape_channel: a legend titled
    "encoding" when they differ; the tooltip names it); the Pareto frontier (data.pareto_points) filled, joined by
    a staircase and labelled (_point_names), the runs tied on it (its band) pale and labelled '(tied)', the runs off
    it hollow. Runs that send nothing become dashed rules at their MAUA over a pale band of its interval, as in the
    accuracy-vs-bytes chart."""
    runs = _runs_of(points, runs)
    if "encoding" not in points:
        points = points.assign(encoding="float32")
    points = points.assign(
        status=["tied" if t else "frontier" if f else "off" for f, t in zip(points["frontier"], points["tied"])]
        if "tied" in points else ["frontier" if f else "off" for f in points["frontier"]],
        label=[f"{r} (tied)" if t else r for r, t in zip(_point_names(points), points.get("tied", [False] * len(points)))])
    for c in ("maua_low", "maua_high"):
        if c not in points:
            points[c] = points["maua"]
    sent, free = points[points["bytes"] > 0], points[points["bytes"] == 0]
    decades = decades_of(sent["bytes"])
    x = alt.X("bytes:Q", title="bytes to the last round (log; counted, exact)", scale=alt.Scale(type="log", domain=[
        decades[0], decades[-1]]), axis=alt.Axis(values=decades, labelExpr=BYTES_LABEL))
    y = alt.Y("maua:Q", title="MAUA (bars: 95% interval)", scale=alt.Scale(zero=False), axis=alt.Axis(format="%"))
    tips = [alt.Tooltip("run:N"), alt.Tooltip("encoding:N", title="encoding"),
            alt.Tooltip("maua:Q", format=".2%", title="MAUA"),
            alt.Tooltip("maua_low:Q", format=".2%", title="95% interval from"),
            alt.Tooltip("maua_high:Q", format=".2%", title="95% interval to"),
            alt.Tooltip("bytes:Q", format=",", title="bytes (B, exact)"), alt.Tooltip("status:N", title="frontier")]
    color = run_color(runs)
    bars = alt.Chart(sent).mark_rule(strokeWidth=1.5, opacity=0.7).encode(
        x=x, y=alt.Y("maua_low:Q", title="MAUA (bars: 95% interval)", scale=alt.Scale(zero=False)), y2=alt.Y2("maua_high:Q"),
        color=color, tooltip=tips)
    dots = alt.Chart(sent).mark_point(size=110, strokeWidth=2).encode(
        x=x, y=y, color=color, shape=encoding_shape_channel(sent["encoding"]),
        fill=alt.condition("datum.status != 'off'", color, alt.value("transparent")),
        fillOpacity=alt.condition("datum.status == 'tied'", alt.value(0.35), alt.value(1.0)), tooltip=tips)
    best = sent[sent["status"] == "frontier"]
    stairs = alt.Chart(best).mark_line(interpolate="step-after", color="#555", strokeDash=[4, 3]).encode(x=x, y=y)
    # labels read away from the nearer edge: rightwards in the left half of the log axis, leftwards in the right half
    # (a label to the right of the rightmost point ran out of the chart)
    named = sent[sent["status"] != "off"]
    middle = (math.log10(decades[0]) + math.log10(decades[-1])) / 2
    right = named["bytes"].map(lambda b: math.log10(b) > middle)
    labels = [alt.Chart(part).mark_text(align=align, dx=dx, dy=-9, fontSize=11, limit=POINT_LABEL_LIMIT).encode(x=x, y=y, text=alt.Text("label:N"))
              for part, align, dx in ((named[~right], "left", 9), (named[right], "right", -9)) if len(part)]
    layers = [stairs, bars, dots, *labels]
    if not free.empty:
        layers.append(alt.Chart(free).mark_rect(opacity=0.12).encode(
            y=alt.Y("maua_low:Q", scale=alt.Scale(zero=False)), y2=alt.Y2("maua_high:Q"), color=color, tooltip=tips))
        layers.append(alt.Chart(free).mark_rule(strokeDash=[6, 4]).encode(y=alt.Y("maua:Q"), color=color, tooltip=tips))
    return alt.layer(*layers).properties(title=alt.TitleParams(  # two lines: one is cut short in a narrow window
        ["Accuracy against bytes:", "the Pareto frontier (filled, labelled)"]), height=HEIGHT)
