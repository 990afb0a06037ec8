"""The dashboard's overview: curves, the comparison table with intervals, paired differences, the Pareto view,
the paper and seed-group tables (Streamlit layout over dashboard.data and dashboard.charts); the other tabs are
dashboard.tabs'. Each view draws into the current container; a failure in one is shown as a one-line message by
`guarded` and leaves the others alone.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pandas as pd
import streamlit as st

from dashboard import charts, data, export, pareto_chart, stages, urlstate, widths
from pipeline.data import datasets
from pipeline.errors import InputFileError

log = logging.getLogger("dashboard")


@contextmanager
def guarded(view: str):
    """A view that fails says why in one line and leaves the other views alone (no traceback)."""
    try:
        yield
    except (stages.InputMissing, datasets.DatasetNotFoundError) as err:
        st.info(str(err))
    except data.ResultsUnavailable as err:
        st.warning(str(err))
    except Exception as err:  # noqa: BLE001 - st.stop/st.rerun are BaseException and pass through
        log.exception("view %s failed", view)
        st.error(f"{view}: could not be drawn ({type(err).__name__}: {err})")



def view_overview(snap: data.Snapshot, ids: list[str], include_setup: bool, baseline: str = "fedavg",
                  group_seeds: bool = False) -> None:
    series = data.series(snap, ids)
    if not series:
        st.info("The selected runs have no rounds yet: curves and the table appear after the first round is written.")
        return
    if group_seeds and not data.has_seed_groups(snap.runs[snap.runs["run_id"].isin(ids)]):
        group_seeds = False  # every group would hold one run: the per-run views say more (legend, 'vs', reasons)
        st.caption("Group seeds: no two selected runs differ only in their seed, so every run is shown on its own.")
    curves = data.accuracy_curves(snap, include_setup)
    labels = data.run_algorithms(snap, [s.run_id for s in series])  # label -> method: its colour
    zero = pd.DataFrame([{"run": snap.label(s.run_id), "maua": s.maua} for s in series
                         if (s.total_bytes if include_setup else s.total_bytes - s.setup_bytes) == 0 and s.maua is not None],
                        columns=["run", "maua"])
    # the charts sit above the table but are drawn after it: the table's data grid is the page's heaviest
    # script for the browser to fetch and start, so its element goes out first (bench/dashboard_load.py)
    charts_area = st.container()
    st.subheader("Comparison")
    if "target" not in st.session_state:
        st.session_state["target"] = url_target() or data.default_target(series, snap)
    target = st.number_input("Target mean accuracy (for bytes to target and speed-up)", min_value=0.0, max_value=1.0,
                             step=0.01, format="%.2f", key="target")
    st.query_params["target"] = f"{target:g}"
    table = data.comparison_frame(snap, ids, target, include_setup, baseline, runs=series)
    if group_seeds:
        _group_table(snap, table, ids, target, include_setup, series)
    else:
        leaders, ties = data.maua_leaders(series)
        _run_table(table, target, include_setup, leaders,
                   data.best_maua_text(series, leaders, ties, snap.label))
    # the curves next (they need no interval), then what compares runs with 95% intervals
    _curves(snap, series, curves, zero, labels, charts_area, group_seeds)
    _differences(snap, series, group_seeds)
    _pareto(table, labels, include_setup, series, method_labels(snap))
    _paper_table(snap, ids, target, include_setup, series)


def _curves(snap: data.Snapshot, series: list, curves: pd.DataFrame, zero: pd.DataFrame, labels: dict[str, str],
            charts_area, group_seeds: bool) -> None:
    """The accuracy curves (against round or time, and against bytes), drawn into `charts_area` above the table."""
    with charts_area:
        axes = ["round", "time", *(["sim"] if data.has_sim_time(curves) else [])]  # sim: runs on simulated devices
        urlstate.opened_with("acc_x", "x", lambda v: v if v in ("round", "time", "sim") else None)  # a shared link
        if st.session_state.get("acc_x") not in axes:
            st.session_state["acc_x"] = "round"  # e.g. 'sim' kept from a selection that had simulated time
        x = st.radio("Left chart: accuracy", axes, key="acc_x", horizontal=True,
                     format_func={"round": "vs round", "time": "vs wall-clock time (cumulative rounds' wall_s)",
                                  "sim": "vs simulated time (the devices' clock)"}.get)
        if not urlstate.opened_with("smoothing", "smoothing", urlstate.smoothing):
            st.session_state.setdefault("smoothing", 0.0)
        weight = st.slider("Smoothing (EMA weight)", 0.0, 0.95, step=0.05, key="smoothing",
                           help="Draws each curve as an exponential moving average (as TensorBoard's slider); the "
                                "tooltips keep the measured value, and the table reads the raw rounds")
        urlstate.write("x", x)
        urlstate.write("smoothing", f"{weight:g}")
        if weight > 0:
            curves = data.smoothed(curves, weight)
        left, right = st.columns(2)
        with left:
            if group_seeds:  # one line per seed group (mean) with its min-max band
                run_ids = [s.run_id for s in series]
                grouped = data.group_curves(snap, curves, run_ids)
                chart = charts.accuracy_band(grouped, data.group_algorithms(snap, run_ids), x)
            else:
                chart = charts.accuracy_vs_round(curves, labels, x)
            st.altair_chart(chart, width="stretch")
            figure_downloads(chart, f"accuracy_vs_{x}", "fig_acc")
        with right:
            chart = charts.accuracy_vs_bytes(curves, zero, labels)
            st.altair_chart(chart, width="stretch")
            figure_downloads(chart, "accuracy_vs_bytes", "fig_bytes")
            if not zero.empty:
                st.caption("Horizontal rules: runs that send no bytes (" + ", ".join(zero["run"]) + "), drawn at their MAUA.")
        st.download_button("Curves (CSV)", curves[["run", "run_id", "algorithm", "round", "mean_acc", "cum_bytes",
                                                   *(["sim_s"] if "sim" in axes else [])]]
                           .to_csv(index=False), "curves.csv", "text/csv", key="curves_csv",
                           help="Mean accuracy and cumulative bytes per round of the selected runs (one row per run and round)")


def _differences(snap: data.Snapshot, series: list, group_seeds: bool) -> None:
    """Each run (or seed group) against local-only and FedCache of its setting: the paired MAUA difference with its
    95% interval and the word that follows it (pipeline.results.compare.differences)."""
    rows = data.differences(data.named_series(snap, series, group_seeds))
    if not rows:
        return
    # Markdown, not a second data grid: the overview keeps one (bench/dashboard_load.py)
    st.markdown("**Paired differences** (each against local-only and FedCache of its setting)\n\n"
                + data.markdown_table(data.difference_table(rows)))
    how = next((r["covers"] for r in rows if r.get("covers")), "")
    st.caption("MAUA minus the reference's, in points, paired by client within a seed and by seed across seeds"
               + (f"; 95% intervals over {how}" if how else "") + '. "ahead" or "behind" only when the interval '
               'excludes 0, otherwise "tied": the runs are not told apart. Pairs need a seed in common and the same '
               "clients (partition).")


def method_labels(snap: data.Snapshot) -> dict[str, str]:
    """run_id -> what ran, as the run stored it ('fedcache (consistency=round, encode_up=int8)'; absent for a run
    from before labels): where the Pareto view reads each run's encoding."""
    if "method_label" not in snap.runs:
        return {}
    return {r: m for r, m in zip(snap.runs["run_id"], snap.runs["method_label"]) if isinstance(m, str) and m}


def _pareto(table: pd.DataFrame, labels: dict[str, str], include_setup: bool, series: list | None = None,
            methods: dict[str, str] | None = None) -> None:
    """MAUA (with its 95% interval) against bytes (exact) with the Pareto frontier: the runs no other run beats
    on both, a tie in MAUA counting as no win (data.pareto_points); each run's encoding its point's shape
    (`methods`: run_id -> method label, whose encode_* knobs name it)."""
    points = data.pareto_points(table, include_setup, series, methods)
    if points.empty:
        return
    left, right = st.columns([3, 2])
    with left:
        chart = pareto_chart.pareto(points, labels)
        st.altair_chart(chart, width="stretch")
        figure_downloads(chart, "pareto_maua_vs_bytes", "fig_pareto")
    # a list, not a grid: a second data grid on the first tab cost ~0.8 s of page load (bench/dashboard_load.py)
    firm, band = points[points["frontier"] & ~points["tied"]], points[points["frontier"] & points["tied"]]

    if len(firm):
        right.markdown("**On the frontier**: no other selected run is ahead of it for as few bytes, nor tied with it "
                       "on the frontier\n\n" + "\n".join(pareto_item(r) for r in firm.itertuples()))
    if len(band):
        right.markdown("**Tied (the frontier's band)**: no other run is ahead of it for as few bytes, but it is tied "
                       "in MAUA with another run there (neither is the better)\n\n"
                       + "\n".join(f"{pareto_item(r)}; tied with {r.tied_with}" for r in band.itertuples()))
    right.caption(f"Bytes: {'all' if include_setup else 'training'} traffic up to each run's last round"
                  f"{'' if include_setup else ' (set-up left out)'}; counted, so exact (no error bar). Error bars: "
                  "MAUA's 95% interval over clients. A run is off the frontier (hollow) only when another run with no "
                  "more bytes is ahead of it beyond a tie: their paired difference's interval (same seed and "
                  "clients), else their own intervals not overlapping. Pale: tied."
                  + (" Shapes: each run's payload encoding (its encode_* params; float32: a circle)."
                     if points["encoding"].nunique() > 1 else ""))


def pareto_item(row) -> str:
    """A run of the Pareto lists: '- <run> (<encoding>): <MAUA [95% interval]>, <bytes>', its encoding named unless
    float32 (what every run sent before encodings) or the run's name says it already (its encode_* knobs)."""
    said = row.encoding == "float32" or "encode_" in row.run
    return (f"- {row.run}{'' if said else f' ({row.encoding})'}: "
            f"{data.accuracy_text(row.maua, row.maua_low, row.maua_high)}, {data.fmt_bytes(row.bytes)}")


def url_target() -> float | None:
    """?target=0.65 from a shared link, when it is a level in (0, 1]."""
    try:
        value = float(st.query_params.get("target", ""))
    except ValueError:
        return None
    return value if 0 < value <= 1 else None


def _run_table(table: pd.DataFrame, target: float, include_setup: bool, leaders: list[str] | None = None,
               best: str = "") -> None:
    """The comparison table, one row per run; `leaders` get the best-MAUA mark (data.mark_best), `best` says why."""
    text, number = st.column_config.TextColumn, st.column_config.NumberColumn
    # numbers underneath, KB/MB/GB and '2.50x' on screen (data.sortable_table): a click on a header sorts
    # by the numbers. No `format` on those columns: a column_config format would replace the text.
    shown = data.display_table(table, include_setup)
    finished = bool((table["status"] == "finished").all())  # then the status column says nothing: left out
    heads = {"run": "run", **({} if finished else {"status": "status"}), "maua": "MAUA [95% CI]",
             "final_acc": "final [95% CI]", "bytes_total": "bytes", "bytes_to_target": f"to {target:.0%}",
             "speedup": "speed-up", "speedup_vs": "vs",
             **({"time_to_target": f"time to {target:.0%}", "waiting_share": "waiting"} if "time_to_target" in table else {})}
    px, rows = fitted(shown, heads, bold=("maua", "bytes_total"), wrappable=("run", "status", "speedup_vs"))
    st.dataframe(
        data.sortable_table(table, include_setup, leaders),
        hide_index=True, width="stretch", row_height=rows, placeholder="—",
        column_config={
            "run": text("run", width=px["run"]), "run_id": None, "target_acc": None, "algorithm": None, "setting": None,
            "status": text("status", width=px["status"]) if "status" in px else None,
            # the intervals' text is wide: the rounds (the caption above has each run's last round) and the set-up
            # bytes (the Communication tab, the CSV) give way to it
            "rounds": None, "bytes_setup": None, **{c: None for c in data.TABLE_INTERVALS},
            "maua": number(heads["maua"], width=px["maua"],
                           help="max over rounds of the mean user accuracy, with its 95% interval over clients (a "
                                "bootstrap: clients and test sampling, not the seed); sorts by the estimate"),
            "final_acc": number(heads["final_acc"], width=px["final_acc"],
                                help="mean user accuracy of the last round, with its 95% interval over clients"),
            "bytes_total": number("bytes", width=px["bytes_total"], help="up + down, set-up included"),
            "bytes_training": None,
            "bytes_to_target": number(heads["bytes_to_target"], width=px["bytes_to_target"],
                                      help="cumulative bytes when the mean accuracy first reaches the target"),
            "speedup": number("speed-up", width=px["speedup"],
                              help=f"to {target:.0%}: bytes the baseline (same setting) needs to reach the level in "
                                   "'vs' over this run's bytes to reach it"),
            "speedup_vs": text("vs", width=px["speedup_vs"], help="the baseline run of the same setting and the accuracy "
                               "compared at: the target, or the baseline's best accuracy when it misses the target"),
            # present when a selected run has simulated time (devices.enabled; docs/devices.md)
            **({"time_to_target": number(heads["time_to_target"], width=px["time_to_target"],
                                         help="simulated seconds when the mean accuracy first reaches the target"),
                "waiting_share": number("waiting", width=px["waiting_share"],
                                        help="share of the participants' simulated time not spent on an update the "
                                             "server used: idle while a sync round waits for its slowest client, or "
                                             "dropped (deadline, offline)")} if "time_to_target" in table else {}),
        })
    st.caption((best + " " if best else "")
               + "Intervals: 95% over clients, per run: two runs are compared by their paired difference (below). "
               f"Bytes to target {'include' if include_setup else 'exclude'} the one-time set-up traffic. "
               "Speed-up compares runs of the same setting (homo/hetero), against the baseline picked in the sidebar; "
               "a setting without a run of that method falls back to its costliest run reaching the target. "
               + ("Every run has finished (a status column shows while one has not). " if finished else "")
               + "The CSV has the raw numbers (bytes, rounds, the intervals' bounds).")
    st.download_button("Download table (CSV)", data.csv_table(table, include_setup), "comparison.csv", "text/csv")


def fitted(shown: pd.DataFrame, heads: dict[str, str], bold=(), wrappable=()) -> tuple[dict[str, int], int | None]:
    """Column widths (px) that show each column's header and texts whole and, together, fit the main area of a 1280 px
    window beside the sidebar (dashboard.widths), with the row height that wraps the `wrappable` text columns
    when they must give way (None: one line)."""
    px = {c: widths.column_px(h, shown[c].astype(str), bold=c in bold) for c, h in heads.items()}
    return widths.fit(px, {c: (heads[c], shown[c].astype(str).tolist()) for c in wrappable if c in px})


def _paper_table(snap: data.Snapshot, ids: list[str], target: float, include_setup: bool,
                 series: list | None = None) -> None:
    """The selected runs beside the FedCache paper's Tables 5 and 6 (same dataset, method and setting)."""
    try:
        frame = data.paper_frame(snap, ids, target, include_setup, run_series=series)
    except InputFileError as err:
        st.warning(f"The paper's figures could not be read: {err}")
        return
    if frame.empty:
        return
    st.subheader("Beside the FedCache paper")
    number, text = st.column_config.NumberColumn, st.column_config.TextColumn
    styler = data.sortable_paper_table(frame)
    # what the grid draws: the text of each number, and the placeholder where there is no number
    on_screen = data.paper_display(frame).where(styler.data.notna(), "—")
    heads = {"run": "run", "table": "table", "maua": "MAUA", "paper_maua": "paper MAUA", "difference": "Δ (points)",
             "gb_total": "bytes", "gb_to_target": f"to {target:.0%}", "paper_gb": "paper GB",
             "speedup": "speed-up", "paper_speedup": "paper speed-up"}
    px, rows = fitted(on_screen, heads, wrappable=("run",))
    # numbers underneath (a click on a header sorts by them), units on screen (data.sortable_paper_table); a cell
    # without a number shows "—", and the caption says why
    st.dataframe(styler, hide_index=True, width="stretch", row_height=rows, placeholder="—", column_config={
        "run_id": None, "run": text("run", width=px["run"]), "table": number("table", format="%d", width=px["table"]),
        "maua": number("MAUA", width=px["maua"]), "paper_maua": number("paper MAUA", width=px["paper_maua"]),
        "difference": number(heads["difference"], width=px["difference"], help="MAUA minus the paper's, in points"),
        "gb_total": number("bytes", width=px["gb_total"], help="the run's bytes, up + down"),
        "gb_to_target": number(heads["gb_to_target"], width=px["gb_to_target"],
                               help="the run's cumulative bytes when its mean accuracy first reaches the target"),
        "paper_gb": number("paper GB", width=px["paper_gb"], help="the paper's GB to its own target accuracy"),
        "speedup": number("speed-up", width=px["speedup"],
                          help=f"bytes to {target:.0%}, against the selected run of the paper's reference method of "
                               "that table (same setting)"),
        "paper_speedup": number("paper speed-up", width=px["paper_speedup"]),
        "reference": None})  # in the caption
    references = ", ".join(f"Table {t}: {r}" for t, r in dict(zip(frame["table"], frame["reference"])).items())
    missing = [f"{run} ({why})" for run, why in zip(frame["run"], frame["speedup_why"]) if why]
    st.caption("The paper's figures (paper/fedcache_tables.csv) are at its scale: K = 300 clients, all training "
               "samples, up to 1,000 rounds, and GB to its own target accuracy per dataset. Speed-ups against the "
               f"paper's reference method of each table ({references}). —: no figure (the paper prints '-', or the "
               "run has none)" + (f"; no speed-up for {', '.join(missing)}" if missing else "") + ".")


def _group_table(snap: data.Snapshot, table: pd.DataFrame, ids: list[str], target: float, include_setup: bool,
                 series: list | None = None) -> None:
    """The comparison table with one row per seed group (per-run comparison aggregated: MAUA over the seeds with
    its 95% interval, the rest mean ± std)."""
    groups = data.group_table(snap, table, ids, series)
    number = st.column_config.NumberColumn  # sorting by the means, showing mean ± std (data.sortable_group_table)
    st.dataframe(data.sortable_group_table(groups), hide_index=True, width="stretch", placeholder="—", column_config={
        "group": "runs (seed group)",
        "maua": number("MAUA [95% CI]", help="the max mean user accuracy over the seeds, with its 95% interval (3 "
                                             "or more seeds: a t interval over them; fewer: a bootstrap over clients)"),
        "final_acc": number("final acc (mean)", format="percent"),
        "bytes_total": number("bytes total (mean)"),
        "bytes_to_target": number(f"bytes to {target:.0%}", help="mean ± std over the seeds that reach the target"),
        "speedup": number(f"speed-up to {target:.0%} (mean)",
                          help="mean of the runs' speed-ups against the sidebar's baseline"),
        "speedup_vs": st.column_config.TextColumn("vs", help="the baseline run and the accuracy compared at (the "
                                                             "group's first run)")})
    how = "; ".join(dict.fromkeys(f"{c}" for c in groups["covers"].dropna())) if "covers" in groups else ""
    st.caption(f"One row per seed group (runs whose params differ only in `seed`). MAUA intervals: 95%, "
               f"{how or 'none (no per-client rows)'}. Bytes to target "
               f"{'include' if include_setup else 'exclude'} the one-time set-up traffic. The CSV has the raw numbers.")
    st.download_button("Download table (CSV)", groups.to_csv(index=False), "comparison_seeds.csv", "text/csv")


def figure_downloads(chart, name: str, key: str) -> None:
    """SVG and PDF buttons under a chart. The file is rendered only when a button is clicked (a callable
    as st.download_button's data), so they cost the page nothing; a click does not rerun the app."""
    if not export.available():
        st.caption(f"SVG/PDF downloads need `{export.PACKAGE}` (`.venv/bin/pip install {export.PACKAGE}`); "
                   "PNG: the chart's menu.")
        return
    with st.container(horizontal=True, gap="small"):
        for fmt, mime in export.FORMATS.items():
            st.download_button(fmt.upper(), export.chart_file(chart, fmt, f"{name}.{fmt}"), f"{name}.{fmt}", mime,
                               key=f"{key}_{fmt}",
                               on_click="ignore", icon=":material/download:", type="tertiary",
                               help=f"This chart as {fmt.upper()} ({export.WIDTH} px wide, white background)")
