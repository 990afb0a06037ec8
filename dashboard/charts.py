"""Altair charts over the frames of dashboard.data / dashboard.stages (no Streamlit here).

Colours are fixed per method (a run is drawn in its algorithm's colour, a second run of the same
method dashed), with explicit scale domains and ranges, so a method looks the same in every chart
(the Communication tab's included) whatever is selected and in whatever order.
"""

from __future__ import annotations

import math
import zlib

import altair as alt
import pandas as pd

HEIGHT = 420  # the whole chart (title, axes and legend included), as Streamlit sizes it

# tableau10 hues, FedCache in red: the method the dashboard is about
METHOD_COLORS = {"fedcache": "#e15759", "fd": "#f28e2b", "fedavg": "#4e79a7", "fedproto": "#59a14f",
                 "local": "#79706e", "pdfl": "#b07aa1", "fedalt": "#76b7b2", "mtfl": "#edc948", "pfedme": "#ff9da7"}
OTHER_COLORS = ["#9c755f", "#17becf", "#bcbd22", "#8c564b", "#e377c2", "#1f77b4", "#bab0ac", "#393b79"]
DASHES = [[1, 0], [6, 3], [2, 2], [8, 3, 2, 3], [1, 3]]  # solid first: one run per method is always solid
# 1KB, 10MB: no '0M' ticks on log axes, and KB as the tables write it (d3's SI prefix for 10^3 is 'k')
BYTES_LABEL = "replace(format(datum.value, '~s'), 'k', 'K') + 'B'"


def _stable(name: str, palette: list):
    """A palette entry picked by the name itself (crc32: the same in every process, unlike hash())."""
    return palette[zlib.crc32(str(name).encode()) % len(palette)]


def method_color(algorithm: str) -> str:
    return METHOD_COLORS.get(algorithm) or _stable(algorithm, OTHER_COLORS)


def _runs_of(df: pd.DataFrame, runs: dict[str, str] | None) -> dict[str, str]:
    """run label -> algorithm: as given (all shown runs, so every chart agrees), else from the frame."""
    if runs is not None:
        return runs
    return dict(zip(df["run"], df["algorithm"])) if "algorithm" in df else {r: r.split("/")[0] for r in df["run"]}


LABEL_LIMIT = 300  # px: a legend label is cut ('…') past this; run labels are shorter (about 6 px a character)
TWO_COLUMNS_UP_TO = 24  # characters: longer labels take one legend column each (two would overflow a half-width chart)
TITLE_CHARS = 40  # a title longer than this wraps onto lines of at most this many characters (Vega cuts it off at the
# plot's width: about 45 characters in half of a 1280 px window)


def legend_columns(labels) -> int:
    """Two legend columns when every label is short, else one: a half-width chart's legend stays inside it."""
    return 2 if max((len(str(x)) for x in labels), default=0) <= TWO_COLUMNS_UP_TO else 1


def wrapped_title(text: str, chars: int = TITLE_CHARS) -> alt.TitleParams:
    """A chart title wrapped at spaces onto lines of at most `chars` characters (Vega cuts a long one short: '…')."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return alt.TitleParams(text=lines if len(lines) > 1 else text)


def _legend(labels=()) -> alt.Legend:
    """Runs' legend: a stroke per run, so a dashed run shows dashed."""
    return alt.Legend(orient="bottom", columns=legend_columns(labels), labelLimit=LABEL_LIMIT, symbolType="stroke",
                      symbolStrokeWidth=2.5)


def decades_of(values: pd.Series) -> list[float]:
    """Powers of ten from the one below the smallest value (strictly: a bar there would have no height)
    to the one above the largest, at least two."""
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (2.0, 10.0)
    decades = [10.0 ** k for k in range(math.floor(math.log10(lo) - 1e-9), math.ceil(math.log10(hi)) + 1)]
    return decades + [decades[-1] * 10] if len(decades) == 1 else decades


def log_bytes_y(decades: list[float], title: str) -> alt.Y:
    """A log bytes axis over the decades, ticked at each (1kB, 10kB, ...): no crowded labels in between."""
    return alt.Y("bytes:Q", title=title, scale=alt.Scale(type="log", domain=[decades[0], decades[-1]]),
                 axis=alt.Axis(values=decades, labelExpr=BYTES_LABEL))


def run_color(runs: dict[str, str], legend: bool | alt.Legend = True, field: str = "run",
              title: str = "run") -> alt.Color:
    """Each run (a value of `field`) in its method's colour; the legend lists the runs."""
    legend = _legend(runs) if legend is True else legend or None
    return alt.Color(f"{field}:N", title=title, legend=legend,
                     scale=alt.Scale(domain=list(runs), range=[method_color(a) for a in runs.values()]))


def _repeats(runs: dict[str, str]) -> list[int]:
    """Per run: how many runs of its method come before it (0 for the first of each method)."""
    seen: dict[str, int] = {}
    out = []
    for algorithm in runs.values():
        out.append(seen.get(algorithm, 0))
        seen[algorithm] = seen.get(algorithm, 0) + 1
    return out


BAR_OPACITY = [1.0, 0.5, 0.3, 0.75, 0.15]


def run_bars(runs: dict[str, str]) -> dict:
    """Bar encodings (colour, opacity) of each run: its method's colour, a second run of the same method
    lighter (bars show no dash); one legend of squares."""
    legend = alt.Legend(orient="bottom", columns=legend_columns(runs), labelLimit=LABEL_LIMIT, symbolType="square")
    opacity = alt.Opacity("run:N", title="run", legend=legend, scale=alt.Scale(
        domain=list(runs), range=[BAR_OPACITY[k % len(BAR_OPACITY)] for k in _repeats(runs)]))
    return {"color": run_color(runs, legend), "opacity": opacity}


def run_dash(runs: dict[str, str], field: str = "run", title: str = "run") -> alt.StrokeDash:
    """Solid for the first shown run of each method, dashed for a second one of the same method (same
    colour); its legend merges with run_color's (same field, title and legend)."""
    dashes = [DASHES[k % len(DASHES)] for k in _repeats(runs)]
    return alt.StrokeDash(f"{field}:N", title=title, legend=_legend(runs),
                          scale=alt.Scale(domain=list(runs), range=dashes))


ACC_Y = alt.Y("mean_acc:Q", title="mean user accuracy", scale=alt.Scale(zero=False), axis=alt.Axis(format="%"))
# The charts of every rerun encode channel objects, not shorthand strings: Altair builds a string (or a dict) into its
# channel through from_dict, which hashes every schema class again on each call.
RUN_TIP = alt.Tooltip("run:N")
ROUND_TIP = alt.Tooltip("round:Q")
BYTES_TIP = alt.Tooltip("cum_bytes:Q", format=",", title="cumulative bytes (B)")
MEAN_ACC_TIP = alt.Tooltip("mean_acc:Q", format=".2%", title="mean accuracy")


def _acc_tips(curves: pd.DataFrame) -> list:
    """The measured accuracy, and the smoothed one when the curves are smoothed (dashboard.data.smoothed)."""
    if "mean_acc_raw" not in curves:
        return [MEAN_ACC_TIP]
    return [alt.Tooltip("mean_acc_raw:Q", format=".2%", title="mean accuracy"),
            alt.Tooltip("mean_acc:Q", format=".2%", title="smoothed")]


def accuracy_vs_round(curves: pd.DataFrame, runs: dict[str, str] | None = None, x: str = "round") -> alt.Chart:
    """x='round', x='time': cumulative wall-clock seconds of the rounds (training + evaluation), or x='sim': the
    rounds' simulated instants (sim_s; devices.enabled)."""
    runs = _runs_of(curves, runs)
    if x == "time":
        title, x_enc = "Mean user accuracy vs wall-clock time", alt.X("cum_s:Q", title="wall-clock time (s, cumulative)")
    elif x == "sim":  # the devices' simulated clock (docs/devices.md); runs without it have no points
        title, x_enc = "Mean user accuracy vs simulated time", alt.X("sim_s:Q", title="simulated time (s)")
        curves = curves.dropna(subset=["sim_s"])
    else:
        title, x_enc = "Mean user accuracy vs round", alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1))
    return alt.Chart(curves, title=wrapped_title(title)).mark_line(point=True).encode(
        x=x_enc, y=ACC_Y, color=run_color(runs), strokeDash=run_dash(runs),
        tooltip=[RUN_TIP, ROUND_TIP, *_acc_tips(curves), alt.Tooltip("cum_s:Q", format=".1f", title="wall-clock s"),
                 BYTES_TIP],
    ).properties(height=HEIGHT).interactive()  # wheel zooms, drag pans; a double click resets


def accuracy_band(grouped: pd.DataFrame, groups: dict[str, str] | None = None, x: str = "round") -> alt.LayerChart:
    """Seed groups (dashboard.data.group_curves): the mean accuracy as a line, the min-max over the seeds
    as a band, both in the method's colour; x='round' or x='time' (mean cumulative wall-clock s)."""
    groups = _runs_of(grouped, groups)
    if x == "time":
        title, x_enc = "Mean user accuracy vs wall-clock time", alt.X("cum_s:Q", title="wall-clock time (s, cumulative, mean)")
    elif x == "sim":
        title, x_enc = "Mean user accuracy vs simulated time", alt.X("sim_s:Q", title="simulated time (s, mean)")
        grouped = grouped.dropna(subset=["sim_s"])
    else:
        title, x_enc = "Mean user accuracy vs round", alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1))
    base = alt.Chart(grouped).encode(x=x_enc)
    band = base.mark_area(opacity=0.2).encode(y=alt.Y("acc_min:Q", title="mean user accuracy", scale=alt.Scale(
        zero=False), axis=alt.Axis(format="%")), y2="acc_max:Q", color=run_color(groups, legend=False))
    line = base.mark_line(point=True).encode(
        y=ACC_Y, color=run_color(groups), strokeDash=run_dash(groups),
        tooltip=[alt.Tooltip("run:N", title="group"), ROUND_TIP, alt.Tooltip("mean_acc:Q", format=".2%", title="mean"),
                 alt.Tooltip("acc_min:Q", format=".2%", title="min"), alt.Tooltip("acc_max:Q", format=".2%", title="max"),
                 alt.Tooltip("n:Q", title="seeds"), BYTES_TIP])
    return alt.layer(band, line).properties(title=wrapped_title(title), height=HEIGHT)


def accuracy_vs_bytes(curves: pd.DataFrame, zero_byte_runs: pd.DataFrame,
                      runs: dict[str, str] | None = None) -> alt.LayerChart | alt.Chart:
    """Log-x lines; runs that send nothing (cumulative 0 B) become dashed rules at their MAUA."""
    runs = _runs_of(curves, runs)
    sent = curves[curves["cum_bytes"] > 0]
    decades = decades_of(sent["cum_bytes"])
    title = "Mean user accuracy vs cumulative bytes (up + down)"
    base = alt.Chart(sent).mark_line(point=True).encode(
        # ticks at the decades only (10KB, 100KB, 1MB ...): in-between labels overlapped in SVG/PDF
        x=alt.X("cum_bytes:Q", title="cumulative bytes (log)", scale=alt.Scale(type="log", domain=[
            decades[0], decades[-1]]), axis=alt.Axis(values=decades, labelExpr=BYTES_LABEL)),
        y=ACC_Y, color=run_color(runs), strokeDash=run_dash(runs),
        tooltip=[RUN_TIP, ROUND_TIP, *_acc_tips(curves), BYTES_TIP],
    ).properties(height=HEIGHT).interactive()  # wheel zooms, drag pans; a double click resets
    if zero_byte_runs.empty:
        return base.properties(title=wrapped_title(title))
    rules = alt.Chart(zero_byte_runs).mark_rule(strokeDash=[6, 4]).encode(
        y=alt.Y("maua:Q"), color=run_color(runs), tooltip=[RUN_TIP, alt.Tooltip("maua:Q", format=".2%", title="MAUA (0 bytes)")])
    return alt.layer(base, rules).properties(title=wrapped_title(title))


# A point's shape says how its run's payloads travel (data.pareto_points' `encoding`): by the encoding's kind
# (pipeline/encoding_spec.py), so "topk:3" and "topk:5" share one; a mixed encoding ("up int8, down float16") one of
# the rest, picked by its text
def client_spread(best: pd.DataFrame, runs: dict[str, str] | None = None) -> alt.Chart:
    """Horizontal boxes (min-max whiskers), one per run, so long run names stay readable; fit-x
    autosize: the height is the plot's, 40 px per run."""
    runs = _runs_of(best, runs)
    return alt.Chart(best, title="Per-client accuracy at each run's best round").mark_boxplot(
        extent="min-max", size=22).encode(
        y=alt.Y("run:N", title=None, sort=list(runs), axis=alt.Axis(labelLimit=260)),
        x=alt.X("acc:Q", title="client accuracy", axis=alt.Axis(format="%")),
        color=run_color(runs, legend=False),
    ).properties(height=40 * max(2, best["run"].nunique()), autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def client_accuracy(history: pd.DataFrame, client_id: int, runs: dict[str, str] | None = None) -> alt.Chart:
    """0-100 % y axis; fit-x autosize, so the height is the plot's and the title and legend come on top."""
    runs = _runs_of(history, runs)
    return alt.Chart(history, title=wrapped_title(f"Client {client_id}: accuracy vs round")).mark_line(point=True).encode(
        x=alt.X("round:Q", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("acc:Q", title="accuracy", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%", tickCount=5)),
        color=run_color(runs), strokeDash=run_dash(runs),
        tooltip=[RUN_TIP, ROUND_TIP, alt.Tooltip("acc:Q", format=".2%"), alt.Tooltip("n_test:Q")],
    ).properties(height=300, autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def bytes_by_family(df: pd.DataFrame, runs: dict[str, str] | None = None) -> alt.Chart:
    """Total bytes per family and direction (set-up up, knowledge down, ...), one bar per run side by side in
    its method's colour, on a log axis (one-time set-up traffic must not flatten the rest; stacking on a
    log axis would misstate the parts)."""
    df = df[df["bytes"] > 0]
    runs = _runs_of(df, runs)
    decades = decades_of(df["bytes"])
    flows = list(dict.fromkeys(df["flow"]))  # data.bytes_by_family's order: set-up, knowledge, parameters, features
    return alt.Chart(df, title="Bytes by what they carry and direction").mark_bar().encode(
        x=alt.X("flow:N", title=None, sort=flows, axis=alt.Axis(labelAngle=0, labelLimit=160)),
        xOffset=alt.XOffset("run:N", sort=list(runs)),
        y=log_bytes_y(decades, "bytes (log)"),
        y2=alt.datum(decades[0]),  # bars rise from the axis' bottom decade: a log axis has no 0
        **run_bars(runs),
        tooltip=[RUN_TIP, alt.Tooltip("flow:N", title="traffic"), alt.Tooltip("kinds:N", title="payload kinds"),
                 alt.Tooltip("bytes:Q", format=",", title="bytes (B)")],
    ).properties(height=HEIGHT)


def bytes_per_round(df: pd.DataFrame, runs: dict[str, str] | None = None) -> alt.Chart:
    """Every selected run's bytes per round (up + down), one line each in its method's colour, on a log axis:
    a one-time set-up round stands out, a method whose traffic grows shows it."""
    df = df[df["bytes"] > 0]
    runs = _runs_of(df, runs)
    return alt.Chart(df, title="Bytes per round (up + down), all selected runs").mark_line(point=True).encode(
        x=alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1)),
        y=log_bytes_y(decades_of(df["bytes"]), "bytes per round (log)"),
        color=run_color(runs), strokeDash=run_dash(runs),
        tooltip=[RUN_TIP, ROUND_TIP, alt.Tooltip("up:Q", format=",", title="up (B)"),
                 alt.Tooltip("down:Q", format=",", title="down (B)"), alt.Tooltip("bytes:Q", format=",", title="total (B)")],
    ).properties(height=HEIGHT)


def label_heatmap(mix: pd.DataFrame) -> alt.Chart:
    return alt.Chart(mix, title="Training label mix per client").mark_rect().encode(
        x=alt.X("class:N", sort=alt.SortField("class_id"), title=None, axis=alt.Axis(labelAngle=-30)),
        y=alt.Y("client_id:O", title="client"),
        color=alt.Color("count:Q", title="samples", scale=alt.Scale(scheme="blues")),
        tooltip=[alt.Tooltip("client_id:Q"), alt.Tooltip("class:N"), alt.Tooltip("count:Q"), alt.Tooltip("share:Q", format=".1%"),
                 alt.Tooltip("test_count:Q")],
    ).properties(height=max(200, 14 * mix["client_id"].nunique()))


# The knowledge cache's metrics (dashboard.data.CACHE_METRICS) as the Cache tab draws them: title, y axis, tooltip
# format, the y scale
CACHE_CHARTS = {
    "cache_coverage": ("Cache coverage: samples with a teacher", "samples with a teacher", "%",
                       alt.Scale(domain=[0, 1])),
    "cache_staleness": ("Staleness: age of the knowledge teachers are built from", "mean age (rounds)", ".2f",
                        alt.Scale(zero=True)),
    "cache_teacher_entropy": ("Teacher entropy: how soft the teachers are", "mean entropy (nats)", ".3f",
                              alt.Scale(zero=True)),
}
TEACHER_CURVES = {"teacher (cache)": [1, 0], "students (mean user accuracy)": [5, 3]}
RUN_SHAPES = ["circle", "square", "triangle-up", "diamond", "cross"]  # a second run of the same method: other points


def _run_shape(runs: dict[str, str]) -> alt.Shape:
    """Points of a second run of the same method in another shape (its lines' dash tells teacher from students);
    merged into run_color's legend (same field, title and legend)."""
    shapes = [RUN_SHAPES[k % len(RUN_SHAPES)] for k in _repeats(runs)]
    return alt.Shape("run:N", title="run", legend=alt.Legend(orient="bottom", columns=legend_columns(runs),
                                                             labelLimit=LABEL_LIMIT),
                     scale=alt.Scale(domain=list(runs), range=shapes))


def cache_metric(stats: pd.DataFrame, metric: str, runs: dict[str, str] | None = None) -> alt.Chart:
    """One knowledge-cache metric (a column of dashboard.data.cache_stats) against round, a line per run in
    its method's colour (a second run of the same method dashed)."""
    title, y_title, fmt, y_scale = CACHE_CHARTS[metric]
    runs = _runs_of(stats, runs)
    df = stats.dropna(subset=[metric])[["run", "round", metric]]
    if metric == "cache_staleness":  # an age in rounds: from 0 to at least 1 round, so equal ages draw no flat axis
        top = max(1.0, math.ceil(float(df[metric].max()))) if len(df) else 1.0
        y_scale, axis = alt.Scale(domain=[0, top], nice=False), alt.Axis(format="~g", tickMinStep=0.1)
    else:
        axis = alt.Axis(format="%") if fmt == "%" else alt.Axis(format="~g")
    return alt.Chart(df, title=wrapped_title(title)).mark_line(point=True).encode(
        x=alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y(f"{metric}:Q", title=y_title, scale=y_scale, axis=axis),
        color=run_color(runs), strokeDash=run_dash(runs),
        tooltip=[RUN_TIP, ROUND_TIP, alt.Tooltip(f"{metric}:Q", format=".2%" if fmt == "%" else fmt, title=y_title)],
    ).properties(height=HEIGHT)


def teacher_vs_students(stats: pd.DataFrame, runs: dict[str, str] | None = None) -> alt.LayerChart:
    """The teachers' accuracy on the training samples (argmax of the cached neighbours' mean logits against the
    label) beside the run's mean user accuracy on the clients' test splits, against round: solid the
    teacher, dashed the students, each run in its method's colour (a second run of a method: other points)."""
    runs = _runs_of(stats, runs)
    curves = list(TEACHER_CURVES)
    df = stats.rename(columns={"cache_teacher_acc": curves[0], "mean_acc": curves[1]}).melt(
        id_vars=["run", "round"], value_vars=curves, var_name="curve", value_name="acc").dropna(subset=["acc"])
    x = alt.X("round:Q", title="round", axis=alt.Axis(tickMinStep=1))
    y = alt.Y("acc:Q", title="accuracy", scale=alt.Scale(zero=False), axis=alt.Axis(format="%"))
    tips = [RUN_TIP, ROUND_TIP, alt.Tooltip("curve:N"), alt.Tooltip("acc:Q", format=".2%", title="accuracy")]
    base = alt.Chart(df).encode(x=x, y=y, tooltip=tips)
    # two layers, so that each legend draws its own symbols: dashes from the lines, runs from the points
    run_legend = alt.Legend(orient="bottom", columns=legend_columns(runs), labelLimit=LABEL_LIMIT)
    lines = base.mark_line().encode(
        color=run_color(runs, run_legend),
        # on top: at the bottom, beside the runs' legend, it ran out of a half-width chart
        strokeDash=alt.StrokeDash("curve:N", title=None, sort=curves, legend=alt.Legend(
            orient="top", symbolType="stroke", symbolStrokeWidth=2.5, labelLimit=LABEL_LIMIT),
            scale=alt.Scale(domain=curves, range=list(TEACHER_CURVES.values()))))
    points = base.mark_point(filled=True, size=45, opacity=1).encode(color=run_color(runs, run_legend),
                                                                     shape=_run_shape(runs))
    return alt.layer(lines, points).properties(title=wrapped_title("Teacher accuracy (cache) vs the students' mean "
                                                                   "user accuracy"),
                                               height=HEIGHT)
