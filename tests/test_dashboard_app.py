"""The Streamlit app through streamlit.testing's AppTest, one test per view, against a small
results DB, partition and knowledge cache built by dashboard.sample_data in a tmp dir."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.components.v2 import manifest_scanner
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from dashboard import charts as charts_mod
from dashboard import data, sample_data, sample_privacy, widths
from dashboard.app import TABS
from pipeline.results.store import ResultsDB

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return sample_data.build_once(tmp_path_factory.getbasetemp() / "dashboard_sample")  # shared, read-only


_installed_components: list | None = None


def _scan_once(*args, **kwargs) -> list:
    """Streamlit's scan of every installed package for components, once a process: every new AppTest runs it
    (about 2 s of reading ~1,000 packages' metadata), and the installed packages do not change under a test."""
    global _installed_components
    if _installed_components is None:
        _installed_components = _scan_components(*args, **kwargs)
    return list(_installed_components)


_scan_components = manifest_scanner.scan_component_manifests


@pytest.fixture
def app(sample, monkeypatch, repo_root):
    """app(**env) -> a run AppTest pointed at the sample inputs (env overrides on top)."""
    monkeypatch.chdir(repo_root)
    monkeypatch.setattr(manifest_scanner, "scan_component_manifests", _scan_once)

    def _make(run: bool = True, tab: str | None = None, **env: str) -> AppTest:
        for k, v in {**sample.env(), "FEDCACHE_DASHBOARD_REFRESH": "0", **env}.items():
            monkeypatch.setenv(k, str(v))
        at = AppTest.from_file(APP, default_timeout=60)
        if tab is not None:  # opened by a link to the tab (?tab=...): its first run draws that tab, not the overview
            assert tab in TABS, tab
            at.query_params["tab"] = tab
        return at.run() if run else at

    return _make


def charts(at: AppTest) -> dict[str, dict]:
    """Vega-Lite specs by title (a title wrapped onto lines: its lines joined by spaces), each with its data frames
    under '_frames'."""
    out = {}
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        title = spec.get("title") or spec.get("mark", {})
        title = title.get("text", json.dumps(title)) if isinstance(title, dict) else str(title)
        title = " ".join(title) if isinstance(title, list) else title
        spec["_frames"] = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in el.proto.datasets]
        if el.proto.data.data:
            spec["_frames"].append(convert_arrow_bytes_to_pandas_df(el.proto.data.data))
        out[title] = spec
    return out


def frame(spec: dict) -> pd.DataFrame:
    return pd.concat(spec["_frames"], ignore_index=True)


def shown(el) -> pd.DataFrame:
    """The text a dataframe element shows: its Styler's display values when it has one (the comparison
    tables: numbers underneath, KB/MB/GB on screen), else its values."""
    styler = el.proto.arrow_data.styler
    return convert_arrow_bytes_to_pandas_df(styler.display_values) if styler.display_values else el.value


def texts(at: AppTest, *kinds: str) -> str:
    return "\n".join(str(e.value) for k in kinds for e in getattr(at, k))


def to_bytes(text: str) -> float:
    """'12.3 KB' -> 12300.0 (the table shows bytes in decimal units)."""
    value, unit = text.split()
    return float(value) * 1000 ** ["B", "KB", "MB", "GB", "TB"].index(unit)


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def open_tab(at: AppTest, name: str) -> AppTest:
    """Open a tab and rerun: only the open tab's content runs (the tabs are stateful, key "tab")."""
    assert name in TABS, name
    at.session_state["tab"] = name
    return at.run()


def click_tab(at: AppTest, name: str) -> AppTest:
    """A click on a tab as the browser sends it: the tabs' new value in the widget states of the rerun, so
    their on_change callback runs (AppTest has no tab clicking; setting session_state runs no callback)."""
    from streamlit.proto.Block_pb2 import Block

    [tabs] = [n for n in at._tree if isinstance(getattr(n, "proto", None), Block) and
              n.proto.WhichOneof("type") == "tab_container"]
    states = at._tree.get_widget_states()
    clicked = states.widgets.add()
    clicked.id, clicked.string_value = tabs.proto.tab_container.id, name
    return at._run(states)


def test_selectors_and_overview(app, sample):
    at = app()
    assert_clean(at)
    assert [t.label for t in at.tabs] == TABS
    runs = at.sidebar.multiselect(key="runs")
    ids = sample.run_ids
    assert set(runs.value) == {ids["fedcache"], ids["local"], ids["fedcache_hetero"]}
    assert set(at.sidebar.multiselect(key="settings").value) == {"homo", "hetero"}

    ch = charts(at)
    curves = frame(ch["Mean user accuracy vs round"])
    assert set(curves["run"]) == {"fedcache/homo aaaaaa", "local/homo bbbbbb", "fedcache/hetero cccccc"}
    assert curves["round"].max() == sample_data.ROUNDS
    by_bytes = ch["Mean user accuracy vs cumulative bytes (up + down)"]
    assert by_bytes["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    assert "local/homo bbbbbb" in texts(at, "caption")  # the zero-byte run is drawn as a MAUA rule

    table = at.dataframe[0].value
    assert {r.split("/")[0] for r in table["run"]} == {"fedcache", "local"}
    fed = table.set_index("run_id").loc[ids["fedcache"]]
    assert fed["maua"] == pytest.approx(max(sample_data.curve(0.8123)))
    assert at.number_input(key="target").value == pytest.approx(0.64)  # lowest MAUA, rounded down
    reached = fed["bytes_to_target"]
    assert reached > fed["bytes_setup"] and fed["speedup"] == 1.0
    text = shown(at.dataframe[0]).set_index("run_id").loc[ids["fedcache"]]
    assert to_bytes(text["bytes_to_target"]) == pytest.approx(reached, rel=1e-3) and text["speedup"] == "1.00x"

    at.number_input(key="target").set_value(0.5).run()
    assert at.dataframe[0].value.set_index("run_id").at[ids["fedcache"], "bytes_to_target"] < reached
    at.sidebar.toggle(key="include_setup").set_value(False).run()
    fed = at.dataframe[0].value.set_index("run_id").loc[ids["fedcache"]]
    assert fed["bytes_to_target"] < fed["bytes_setup"]  # training traffic only

    # homo only, and an older run added side by side
    at.sidebar.multiselect(key="settings").set_value(["homo"]).run()
    assert ids["fedcache_hetero"] not in at.sidebar.multiselect(key="runs").value
    at.sidebar.multiselect(key="runs").select(ids["starting"]).run()
    assert_clean(at)
    assert "has no rounds yet" in texts(at, "info")
    assert all("/homo " in r for r in at.dataframe[0].value["run"])


@pytest.fixture
def mixed(sample, tmp_path):
    """(results DB, ids) of sample_data.write_mixed_runs: one set-up's finished runs, a test run, a killed run."""
    path = tmp_path / "mixed.duckdb"
    return path, sample_data.write_mixed_runs(ResultsDB(path), sample.root)


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_default_selection_skips_test_and_killed_runs_and_warns_on_mixed_setups(app, mixed):
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    runs = at.sidebar.multiselect(key="runs")
    assert runs.value == [ids["fedavg"], ids["fedcache"], ids["local"]]
    assert "not directly comparable" not in texts(at, "warning")
    killed = [o for o in runs.options if "eeeee1" in o]
    assert len(killed) == 1 and "stale (no round for" in killed[0] and "running" not in killed[0]
    runs.select(ids["test"]).run()  # a 4-round run beside 6-round ones
    warning = texts(at, "warning")
    assert "not directly comparable" in warning and "**train.rounds** 4 (fedcache/homo ddddd1)" in warning
    runs.select(ids["killed"]).run()  # the table says stale too
    assert at.dataframe[0].value.set_index("run_id").at[ids["killed"], "status"].startswith("stale (no round for")


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_speedup_baseline_is_picked_in_the_sidebar_and_misses_say_not_reached(app, mixed, sample):
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path)
    assert at.sidebar.selectbox(key="baseline").value == "fedavg"  # a FedAvg run is selected
    assert at.sidebar.selectbox(key="baseline").options == ["fedavg", "fedcache", "local",
                                                            "costliest run reaching the target"]
    table = shown(at.dataframe[0]).set_index("run_id")
    assert (table["speedup_vs"] == "fedavg at 64.0%").all()
    assert table.at[ids["fedavg"], "speedup"] == "1.00x" and float(table.at[ids["fedcache"], "speedup"][:-1]) > 1
    assert table.at[ids["local"], "speedup"] == "no bytes sent" and table.at[ids["local"], "bytes_total"] == "0 B"
    assert table.at[ids["fedavg"], "bytes_total"] == "1.4 MB"  # 6 rounds x 6 clients x 2 x 20 kB = 1.44 MB
    at.sidebar.selectbox(key="baseline").set_value("fedcache").run()
    table = shown(at.dataframe[0]).set_index("run_id")
    assert table.at[ids["fedcache"], "speedup"] == "1.00x" and float(table.at[ids["fedavg"], "speedup"][:-1]) < 1
    assert at.sidebar.selectbox(key="baseline").value == "fedcache"  # kept across reruns
    at.number_input(key="target").set_value(0.95).run()  # above every run's MAUA
    table = shown(at.dataframe[0]).set_index("run_id")
    assert (table["bytes_to_target"] == "not reached").all()
    # a baseline that misses the target is compared at its best accuracy (pipeline.results.compare)
    assert (table["speedup_vs"] == "fedcache at 79.9%").all() and table.at[ids["fedcache"], "speedup"] == "1.00x"
    assert table.at[ids["fedavg"], "speedup"] == table.at[ids["local"], "speedup"] == "not reached"
    assert not table.isna().any().any() and "None" not in table.to_string()

    at = app()  # no FedAvg run: the costliest run reaching the target
    assert at.sidebar.selectbox(key="baseline").value == ""
    assert set(at.dataframe[0].value["speedup_vs"]) == {"fedcache at 64.0%"}


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_bytes_and_speedup_columns_sort_as_numbers_and_show_units(app, mixed):
    """The grid sorts a column by its values: the bytes and speed-up columns hold numbers (text would put
    '1.4 MB' before '506.9 KB', and '10.00x' before '2.00x') and show KB/MB/GB and '2.50x' (a Styler)."""
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path)
    values, text = at.dataframe[0].value.set_index("run_id"), shown(at.dataframe[0]).set_index("run_id")
    for col in ("bytes_total", "bytes_setup", "bytes_training", "bytes_to_target", "speedup"):
        assert pd.api.types.is_float_dtype(values[col]), (col, values[col].tolist())
    assert values.at[ids["fedavg"], "bytes_total"] == 1_440_000 and text.at[ids["fedavg"], "bytes_total"] == "1.4 MB"
    assert text.at[ids["fedcache"], "bytes_total"] == "506.9 KB" and text.at[ids["local"], "bytes_total"] == "0 B"
    order = [ids["local"], ids["fedcache"], ids["fedavg"]]  # 0 B < 506.9 KB < 1.4 MB
    assert values["bytes_total"].sort_values().index.tolist() == order
    assert text["bytes_total"].sort_values().index.tolist() != order  # as text: '0 B' < '1.4 MB' < '506.9 KB'
    assert values.at[ids["fedcache"], "speedup"] > values.at[ids["fedavg"], "speedup"] == 1.0
    assert values.at[ids["local"], "speedup"] == float("inf") and text.at[ids["local"], "speedup"] == "no bytes sent"
    at.number_input(key="target").set_value(0.95).run()  # nobody reaches it: 'not reached' sorts after every number
    at.sidebar.selectbox(key="baseline").set_value("fedcache").run()  # compared at FedCache's best: FedAvg misses
    values, text = at.dataframe[0].value.set_index("run_id"), shown(at.dataframe[0]).set_index("run_id")
    assert (values["bytes_to_target"] == float("inf")).all() and (text["bytes_to_target"] == "not reached").all()
    assert values.at[ids["fedavg"], "speedup"] == -float("inf") and text.at[ids["fedavg"], "speedup"] == "not reached"


def test_accuracy_vs_wall_clock_time(app):
    at = app()
    assert at.radio(key="acc_x").value == "round"
    at.radio(key="acc_x").set_value("time").run()
    assert_clean(at)
    ch = charts(at)
    assert "Mean user accuracy vs round" not in ch
    spec = ch["Mean user accuracy vs wall-clock time"]
    assert spec["encoding"]["x"]["field"] == "cum_s"
    fed = frame(spec).query("run == 'fedcache/homo aaaaaa'")
    assert fed["cum_s"].tolist() == pytest.approx([0.5 * (r + 1) for r in range(sample_data.ROUNDS + 1)])  # 0.5 s/round


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_accuracy_vs_simulated_time_and_time_to_target(app, sample, tmp_path):
    """Issue 24: runs on simulated devices offer 'vs simulated time' and the table's time to target and
    waiting share; a run without simulated time says why, not a number."""
    assert app().radio(key="acc_x").options == ["vs round", "vs wall-clock time (cumulative rounds' wall_s)"]
    path = tmp_path / "timed.duckdb"
    ids = sample_data.write_timed_runs(ResultsDB(path), sample.root)
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    assert at.radio(key="acc_x").options[-1] == "vs simulated time (the devices' clock)"
    at.number_input(key="target").set_value(0.7).run()
    values, text = at.dataframe[0].value.set_index("run_id"), shown(at.dataframe[0]).set_index("run_id")
    # FedCache: 0.81 - 0.71 * 0.5^r first reaches 0.7 at round 3, its instant (3 + 1) x 2 s
    assert values.at[ids["fedcache"], "time_to_target"] == pytest.approx(8.0)
    assert text.at[ids["fedcache"], "time_to_target"] == "8.0 s" and text.at[ids["fedcache"], "waiting_share"] == "40.0%"
    assert text.at[ids["fedavg"], "time_to_target"] == "25.0 s"  # 0.78 - 0.68 * 0.5^r: round 4, at 5 s a round
    assert text.at[ids["local"], "time_to_target"] == text.at[ids["local"], "waiting_share"] == "— (devices off)"
    assert values.at[ids["local"], "time_to_target"] == float("inf")  # sorts after every number
    # the comparison grid and the paper's (FedCache and FedAvg on MNIST): the clock adds columns, no grid
    assert len(at.dataframe) == 2 and "time_to_target" not in at.dataframe[1].value
    at.radio(key="acc_x").set_value("sim").run()
    assert_clean(at)
    spec = charts(at)["Mean user accuracy vs simulated time"]
    assert spec["encoding"]["x"]["field"] == "sim_s"
    drawn = frame(spec)
    assert set(drawn["run"]) == {"fedcache (schedule=async)/homo aaaaa4", "fedavg (schedule=deadline)/homo bbbbb4"}
    fed = drawn.query("run == 'fedcache (schedule=async)/homo aaaaa4'")
    assert fed["sim_s"].tolist() == pytest.approx([2.0 * (r + 1) for r in range(sample_data.ROUNDS + 1)])
    # a selection without simulated time: the option goes, and the axis falls back to rounds
    at.sidebar.multiselect(key="runs").set_value([ids["local"]]).run()
    assert_clean(at)
    assert at.radio(key="acc_x").value == "round" and len(at.radio(key="acc_x").options) == 2


def test_clients_view(app):
    at = app(tab="Clients")
    ch = charts(at)
    spread = ch["Per-client accuracy at each run's best round"]
    assert spread["mark"]["type"] == "boxplot"
    assert len(frame(spread)) == 3 * sample_data.K  # every client of every run at its best round
    assert spread["height"] == 3 * 40 and spread["autosize"]["type"] == "fit-x"  # 40 px of plot per run
    at.selectbox(key="client").set_value(3).run()
    assert_clean(at)
    drill = charts(at)["Client 3: accuracy vs round"]
    assert set(frame(drill)["round"]) == set(range(sample_data.ROUNDS + 1))
    # readable: a line per run on a 0-100 % axis, 300 px of plot that the title and legend do not eat
    assert drill["mark"]["type"] == "line" and drill["encoding"]["y"]["scale"]["domain"] == [0, 1]
    assert drill["encoding"]["y"]["axis"]["format"] == "%"
    assert drill["height"] >= 300 and drill["autosize"]["type"] == "fit-x"


def test_no_deploy_button(app):
    from streamlit import config

    try:
        at = app()
        assert_clean(at)
        assert config.get_option("client.toolbarMode") == "minimal"
    finally:
        config.set_option("client.toolbarMode", "auto", config.ConfigOption.DEFAULT_DEFINITION)


def scale(spec: dict, channel: str = "color") -> dict:
    """value -> colour (or dash) of a chart's scale."""
    enc = (spec.get("layer") or [spec])[0]["encoding"][channel]
    return dict(zip(enc["scale"]["domain"], enc["scale"]["range"]))


def test_communication_view(app, sample):
    at = app(tab="Communication")
    ch = charts(at)
    by_family, per_round = ch["Bytes by what they carry and direction"], ch["Bytes per round (up + down), all selected runs"]
    totals = frame(by_family)
    assert {"set-up up", "knowledge up", "knowledge down"} <= set(totals["flow"])
    # both on a log bytes axis (FedCache's set-up round does not flatten the rest), byte-unit tick labels
    for spec in (by_family, per_round):
        y = spec["encoding"]["y"]
        assert y["scale"]["type"] == "log" and "B'" in y["axis"]["labelExpr"]
        assert y["axis"]["values"][0] <= frame(spec)["bytes"].min() and y["axis"]["values"][-1] >= frame(spec)["bytes"].max()
    assert by_family["encoding"]["y2"]["datum"] == by_family["encoding"]["y"]["axis"]["values"][0]  # bars need a base > 0
    # every selected run that sends bytes, one line each, in its method's colour in both charts
    assert set(frame(per_round)["run"]) == {"fedcache/homo aaaaaa", "fedcache/hetero cccccc"}
    assert (frame(per_round)["bytes"] > 0).all()
    assert scale(by_family) == scale(per_round) == {"fedcache/homo aaaaaa": charts_mod.METHOD_COLORS["fedcache"],
                                                    "fedcache/hetero cccccc": charts_mod.METHOD_COLORS["fedcache"]}
    at.sidebar.toggle(key="include_setup").set_value(False).run()
    assert "set-up up" not in set(frame(charts(at)["Bytes by what they carry and direction"])["flow"])
    assert "local/homo bbbbbb" in texts(at, "caption")  # listed as sending nothing


PRIVACY_TITLES = {attack: spec.title for attack, spec in data.ATTACKS.items()}


def privacy_chart(at: AppTest, attack: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """An attack's scatter: its points (one row per run and figure), its baseline rules, and the spec."""
    spec = charts(at)[PRIVACY_TITLES[attack]]
    rows = frame(spec)
    points = rows.dropna(subset=["mean"]).drop_duplicates(["run", "series"]).set_index(["run", "series"])
    return points, rows.dropna(subset=["baseline"]).drop_duplicates(), spec


def layer_fields(spec: dict) -> list[dict[str, str]]:
    """Each layer's encoded fields by channel (x, x2, y, y2, ...)."""
    return [{k: v.get("field") for k, v in layer["encoding"].items() if isinstance(v, dict)} for layer in spec["layer"]]


def test_privacy_view(app, sample, tmp_path):
    """The Privacy tab: per attack a scatter of the audited runs (x the figure with its 95% interval, y the run's MAUA
    with its interval, bytes in the tooltip, the baseline as a dashed rule), every figure in a table, the runs without
    an audit named; with none audited, the command that makes one; an index from before the privacy table says so."""
    ids = sample.run_ids
    at = app(tab="Privacy")
    assert_clean(at)
    assert set(PRIVACY_TITLES.values()) <= set(charts(at))
    snap = data.load_snapshot(sample.results_db, [ids["fedcache"], ids["local"]])
    bytes_sent = snap.rounds.assign(b=snap.rounds["bytes_up"] + snap.rounds["bytes_down"]).groupby("run_id")["b"].sum()
    maua = {ids["fedcache"]: max(sample_data.curve(0.8123)), ids["local"]: max(sample_data.curve(0.6547))}
    intervals = {s.run_id: data.run_intervals(s) for s in data.series(snap, list(maua))}
    run = {"fedcache/homo aaaaaa": ids["fedcache"], "local/homo bbbbbb": ids["local"]}
    expected = {"reconstruction": {("fedcache/homo aaaaaa", "reconstruction"): "psnr"},
                "membership": {(r, name): m for r in run for m, name in (("mia_auc", "loss threshold"),
                                                                         ("lira_auc", "LiRA"))},
                "label_mix": {("fedcache/homo aaaaaa", "label mix"): "label_tv"}}
    baselines = {"reconstruction": [11.9], "membership": [0.5], "label_mix": [0.52]}
    for attack, figures in expected.items():
        points, rules, spec = privacy_chart(at, attack)
        assert set(points.index) == set(figures), attack  # the local run sends nothing: membership only
        for (label, name), metric in figures.items():
            p, method = points.loc[(label, name)], label.split("/")[0]
            figure = sample_privacy.PRIVACY[method][metric]
            assert (p["mean"], p["low"], p["high"]) == pytest.approx(figure), (attack, label)
            assert p["maua"] == pytest.approx(maua[run[label]])
            iv = intervals[run[label]]
            assert (p["maua_low"], p["maua_high"]) == pytest.approx((iv["maua_low"], iv["maua_high"]))
            assert p["maua_low"] < p["maua"] < p["maua_high"]
            assert p["bytes"] == bytes_sent[run[label]]  # local-only: 0
        assert sorted(rules["baseline"]) == pytest.approx(baselines[attack]), attack
        fields = layer_fields(spec)  # both intervals drawn as bars, the baseline as a rule
        assert {"x": "low", "x2": "high", "y": "maua", "color": "run"} in fields
        assert {"x": "mean", "y": "maua_low", "y2": "maua_high", "color": "run"} in fields
        assert {"x": "baseline"} in fields
        assert any(t.get("field") == "bytes" for layer in spec["layer"] for t in layer["encoding"].get("tooltip", []))
        drawn = set(points.index.get_level_values(0))  # the runs with a point, each in its method's colour
        assert scale(spec["layer"][-1]) == {label: charts_mod.METHOD_COLORS[label.split("/")[0]] for label in drawn}
    table = texts(at, "markdown")
    assert "| fedcache/homo aaaaaa | 13.2 [12.6, 13.9] (11.9) | 0.21 [0.17, 0.25] | 0.56 [0.52, 0.60] |" in table
    assert ("| local/homo bbbbbb | n/a | n/a | 0.58 [0.53, 0.63] | 0.04 [0.02, 0.07] | 0.64 [0.58, 0.70] | n/a |"
            in table)
    notes = texts(at, "caption")
    assert "No audit: fedcache/hetero cccccc" in notes and "No figure" in notes and "local/homo bbbbbb" in notes

    # only a run without an audit: no chart, the command that makes one
    at.sidebar.multiselect(key="runs").set_value([ids["fedcache_hetero"]]).run()
    assert_clean(at)
    assert not set(PRIVACY_TITLES.values()) & set(charts(at))
    assert "None of the selected runs has a privacy audit (fedcache/hetero cccccc)" in texts(at, "info")
    assert "`.venv/bin/dvc repro` runs `audit@<method>`" in texts(at, "info")

    # an index from before the privacy table: the tab says so, with the rebuild
    db = ResultsDB(tmp_path / "old.duckdb")
    sample_data.write_run(db, "fedcache-20250101-000000-old000", "fedcache", "homo",
                          sample_data.params_for(sample.root), np.full(sample_data.K, sample_data.PER_CLIENT),
                          sample_data.curve(0.8))
    at = app(FEDCACHE_RESULTS_DB=db.path, tab="Privacy")
    assert_clean(at)
    assert not set(PRIVACY_TITLES.values()) & set(charts(at))
    assert "has no privacy table" in texts(at, "info") and "pipeline.results.store rebuild" in texts(at, "info")


def test_privacy_view_beside_fedavg(app, mixed):
    """FedAvg's gradient inversion beside FedCache's code inversion (each against its own mean-image baseline), and a
    label mix estimated (TV above 0) beside one sent by design (0); set-up traffic off changes the bytes shown."""
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path, tab="Privacy")
    assert_clean(at)
    points, rules, _ = privacy_chart(at, "reconstruction")
    assert {label for label, _ in points.index} == {"fedavg/homo bbbbb1", "fedcache/homo aaaaa1"}
    assert points.loc[("fedavg/homo bbbbb1", "reconstruction"), "mean"] == pytest.approx(10.4)
    assert sorted(rules["baseline"]) == pytest.approx([11.7, 11.9])  # each run's own mean public image
    tv = privacy_chart(at, "label_mix")[0]["mean"]
    assert tv.to_dict() == pytest.approx({("fedavg/homo bbbbb1", "label mix"): 0.21,
                                          ("fedcache/homo aaaaa1", "label mix"): 0.0})
    with_setup = privacy_chart(at, "reconstruction")[0]["bytes"]
    at.sidebar.toggle(key="include_setup").set_value(False).run()
    without = privacy_chart(at, "reconstruction")[0]["bytes"]
    assert without[("fedavg/homo bbbbb1", "reconstruction")] == with_setup[("fedavg/homo bbbbb1", "reconstruction")]
    assert without[("fedcache/homo aaaaa1", "reconstruction")] < with_setup[("fedcache/homo aaaaa1", "reconstruction")]


def test_a_decentralized_runs_downloads_are_what_its_clients_receive_from_peers(app, sample, tmp_path):
    """Issue 37: pDFL's traffic is one ledger row per payload, "up" for the sender with the receiver as peer; its
    download columns read "—". A client's downloads are now the bytes its peers sent it (Clients tab), and the
    Communication tab has pDFL's "down" bars and per-round downloads, its totals counting each transfer once."""
    path = tmp_path / "pdfl.duckdb"
    ids = sample_data.write_pdfl_runs(ResultsDB(path), sample.root)
    at = app(FEDCACHE_RESULTS_DB=path, tab="Clients")
    assert_clean(at)
    client_bytes = next(d for d in at.dataframe if "up: parameters" in d.value.columns).value.set_index("run")
    pdfl = client_bytes.loc["pdfl/homo peers1"]
    per_edge = sample_data.ROUNDS * 2  # rounds x its two ring neighbours
    assert pdfl["up: parameters"] == pdfl["down: parameters"] == data.fmt_bytes(per_edge * sample_data.MODEL_BYTES)
    assert pdfl["down: knowledge"] == data.fmt_bytes(per_edge * sample_data.PDFL_KNOWLEDGE_BYTES)
    assert "—" not in pdfl.to_string()
    open_tab(at, "Communication")
    assert_clean(at)
    ch = charts(at)
    flows = frame(ch["Bytes by what they carry and direction"]).query("run == 'pdfl/homo peers1'")
    by_flow = flows.set_index("flow")["bytes"]
    sent = sample_data.ROUNDS * sample_data.K * 2 * sample_data.MODEL_BYTES
    assert by_flow["parameters up"] == by_flow["parameters down"] == sent
    per_round = frame(ch["Bytes per round (up + down), all selected runs"]).query("run == 'pdfl/homo peers1'")
    assert (per_round["down"] == per_round["up"]).all() and (per_round["bytes"] == per_round["up"]).all()
    at = app(FEDCACHE_RESULTS_DB=path)  # the comparison table's bytes: each transfer once
    total = at.dataframe[0].value.set_index("run_id").at[ids["pdfl"], "bytes_total"]
    assert total == sent + sample_data.ROUNDS * sample_data.K * 2 * sample_data.PDFL_KNOWLEDGE_BYTES


def test_colour_per_method_whatever_the_selection(app, sample):
    ids = sample.run_ids
    at = app()
    before = scale(charts(at)["Mean user accuracy vs round"])
    assert before["fedcache/homo aaaaaa"] == before["fedcache/hetero cccccc"] == charts_mod.METHOD_COLORS["fedcache"]
    assert before["local/homo bbbbbb"] == charts_mod.METHOD_COLORS["local"]
    at.sidebar.multiselect(key="runs").set_value([ids["local"], ids["fedcache"]]).run()  # fewer, other order
    ch = charts(at)
    for title in ("Mean user accuracy vs round", "Mean user accuracy vs cumulative bytes (up + down)"):
        after = scale(ch[title])
        assert {k: before[k] for k in after} == after, title
    after = scale(charts(open_tab(at, "Clients"))["Per-client accuracy at each run's best round"])
    assert {k: before[k] for k in after} == after


CACHE_TITLES = {"cache_coverage": "Cache coverage: samples with a teacher",
                "cache_staleness": "Staleness: age of the knowledge teachers are built from",
                "cache_teacher_acc": "Teacher accuracy (cache) vs the students' mean user accuracy",
                "cache_teacher_entropy": "Teacher entropy: how soft the teachers are"}


def test_cache_view(app, sample, tmp_path):
    """The Cache tab: FedCache's knowledge cache per round, one chart per metric, the selected FedCache runs only,
    in FedCache's colour; the teachers' accuracy beside the students' mean user accuracy."""
    at = app(tab="Cache")
    assert_clean(at)
    ch = charts(at)
    fedcache_runs = {"fedcache/homo aaaaaa", "fedcache/hetero cccccc"}  # the local run records no cache
    for metric, title in CACHE_TITLES.items():
        assert set(frame(ch[title])["run"]) == fedcache_runs, title
        assert set(scale(ch[title]).values()) == {charts_mod.METHOD_COLORS["fedcache"]}, title
    coverage = frame(ch[CACHE_TITLES["cache_coverage"]])
    assert coverage["cache_coverage"].between(0, 1).all() and coverage["round"].max() == sample_data.ROUNDS
    assert ch[CACHE_TITLES["cache_coverage"]]["encoding"]["y"]["axis"]["format"] == "%"
    assert (frame(ch[CACHE_TITLES["cache_staleness"]])["cache_staleness"] >= 0).all()
    assert 0 not in set(frame(ch[CACHE_TITLES["cache_staleness"]])["round"])  # set-up: no teacher, no age
    teacher = frame(ch[CACHE_TITLES["cache_teacher_acc"]])
    homo = teacher[teacher["run"] == "fedcache/homo aaaaaa"].pivot(index="round", columns="curve", values="acc")
    accs = sample_data.curve(0.8123)
    assert homo["students (mean user accuracy)"].tolist() == pytest.approx(accs)
    assert homo["teacher (cache)"].dropna().tolist() == pytest.approx(
        [sample_data.cache_metrics(r, a)["cache_teacher_acc"] for r, a in enumerate(accs) if r > 0])
    assert "softmax(teacher / fedcache.T)" in texts(at, "caption")

    # no selected run recorded the cache: a note naming the runs that did
    at.sidebar.multiselect(key="runs").set_value([sample.run_ids["local"]]).run()
    assert_clean(at)
    assert not set(CACHE_TITLES.values()) & set(charts(at))
    assert "Runs that have it: fedcache/hetero cccccc, fedcache/homo aaaaaa" in texts(at, "info")

    # none in the whole file (a FedCache run from before the metrics): how to get one
    db = ResultsDB(tmp_path / "old.duckdb")
    sample_data.write_run(db, "fedcache-20250101-000000-old000", "fedcache", "homo",
                          sample_data.params_for(sample.root), np.full(sample_data.K, sample_data.PER_CLIENT), sample_data.curve(0.8))
    with db.connect() as con:
        con.execute("DELETE FROM round_metrics")
    at = app(FEDCACHE_RESULTS_DB=db.path, tab="Cache")
    assert_clean(at)
    note = texts(at, "info")
    assert "ran before FedCache recorded its cache" in note and "`make run`" in note


def rendered_svg(el) -> str:
    """A chart element drawn to SVG by vl-convert, as the browser draws it: its spec with its datasets inline."""
    import vl_convert

    spec = json.loads(el.proto.spec)
    spec["datasets"] = {d.name: json.loads(convert_arrow_bytes_to_pandas_df(d.data.data).to_json(orient="records"))
                        for d in el.proto.datasets}
    return vl_convert.vegalite_to_svg(spec)


def test_equal_staleness_draws_a_readable_axis(app, sample, tmp_path):
    """Issue 37: when every round's staleness is the same (0: the cache rebuilt as it is read), the staleness chart
    had a flat axis whose one tick read "0.000000"; now it spans 0 to 1 round, ticked 0, 0.2, ... 1."""
    path = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, path)
    with ResultsDB(path).connect() as con:
        con.execute("UPDATE round_metrics SET value = 0 WHERE name = 'cache_staleness'")
    at = app(FEDCACHE_RESULTS_DB=path, run=False)
    at.query_params = {"runs": [sample.run_ids["fedcache"]], "tab": "Cache"}
    at.run()
    assert_clean(at)
    spec = charts(at)[CACHE_TITLES["cache_staleness"]]
    assert set(frame(spec)["cache_staleness"]) == {0.0}
    assert spec["encoding"]["y"]["scale"]["domain"] == [0, 1]
    [el] = [e for e in at.get("vega_lite_chart") if "Staleness" in e.proto.spec]
    ticks = re.findall(r"<text[^>]*>([^<]*)</text>", rendered_svg(el))
    assert "0.000000" not in ticks and "0" in ticks and "1" in ticks, ticks


def test_partition_view(app, sample):
    at = app(tab="Partition")
    heat = frame(charts(at)["Training label mix per client"])
    assert len(heat) == sample_data.K * 10 and heat["client_id"].nunique() == sample_data.K
    assert "6 clients, 240 training" in texts(at, "caption")


def test_neighbours_view(app):
    at = app(tab="Neighbours")
    assert len(at.get("image")) == 4
    captions = [i.proto.imgs[0].caption for i in at.get("image")]
    assert all(f"{sample_data.R} nearest cached neighbours" in c for c in captions)
    at.slider(key="nb_n").set_value(2).run()
    at.selectbox(key="nb_label").set_value(7).run()
    assert_clean(at)
    assert [i.proto.imgs[0].caption.split(" · ")[1] for i in at.get("image")] == ["7", "7"]


# The main area beside the sidebar in a 1280 px wide window (Streamlit's wide layout; measured in Chromium).
MAIN_AREA_PX = 820


def _fits(frame) -> list[str]:
    """The shown columns of a dataframe element, after checking each has a width and together they fit."""
    config = json.loads(frame.proto.columns)
    shown = [c for c in frame.value.columns if not config.get(c, {}).get("hidden")]
    assert all("width" in config.get(c, {}) for c in shown), [c for c in shown if "width" not in config.get(c, {})]
    assert sum(config[c]["width"] for c in shown) <= MAIN_AREA_PX, {c: config[c]["width"] for c in shown}
    return shown


def test_the_comparison_table_fits_a_1280_px_window(app, sample):
    """Every shown column has a width, and together they fit: no column cut off or scrolled out of view."""
    at = app()
    shown = _fits(at.dataframe[0])
    assert {"run", "maua", "bytes_total", "bytes_to_target", "speedup", "speedup_vs"} <= set(shown)


def test_the_clients_tables_fit_a_1280_px_window(app, sample):
    """The per-run accuracy spread and a client's bytes: full width, every column sized, by traffic family."""
    at = app(tab="Clients")
    stats = next(d for d in at.dataframe if "median" in d.value.columns)
    assert _fits(stats) == ["run", "best round", "min", "median", "max", "std"]
    assert len(stats.value) == 3  # the three selected runs
    client_bytes = next(d for d in at.dataframe if "up: knowledge" in d.value.columns)
    shown = _fits(client_bytes)
    assert shown[0] == "run" and all(c.split(": ")[0] in ("up", "down") for c in shown[1:])
    assert shown.index("up: set-up") < shown.index("up: knowledge") < shown.index("down: knowledge")
    fedcache = client_bytes.value.set_index("run").loc["fedcache/homo aaaaaa"]
    assert fedcache["up: set-up"].endswith(("B", "KB")) and fedcache["down: knowledge"] != "—"


def on_screen(el) -> pd.DataFrame:
    """The text the grid draws in each cell: the Styler's text, or the value in its column's format (at most as
    long: 'percent' with two decimals, a printf format), where there is a value, and the element's placeholder
    where there is none ("None" when it has no placeholder)."""
    placeholder = el.proto.placeholder if el.proto.HasField("placeholder") else "None"
    text = shown(el).copy()
    if not el.proto.arrow_data.styler.display_values:
        for c, conf in json.loads(el.proto.columns).items():
            fmt = conf.get("type_config", {}).get("format")
            if c in text and fmt:
                text[c] = [f"{v:.2%}" if fmt == "percent" else fmt % v for v in el.value[c]]
    return text.astype(str).where(el.value.notna().to_numpy(), placeholder)


def assert_nothing_cut(el, bold=("maua", "bytes_total")) -> None:
    """Every shown column's header and every text the grid draws in it fit the column's width, in the grid's font
    (dashboard.widths: 14 px Source Sans measured in Chromium, 8 px padding each side): on one line, or, in a text
    column of a table whose rows are tall enough to wrap, in the row's lines. `bold`: columns with bold (marked)
    cells."""
    config = json.loads(el.proto.columns)
    lines = el.proto.row_height // widths.LINE_PX if el.proto.row_height > 64 else 1
    texts = on_screen(el)
    for c in [c for c in el.value.columns if not config.get(c, {}).get("hidden")]:
        width, label = config[c]["width"], config[c].get("label", c)
        assert widths.text_px(label) + widths.PADDING_PX <= width, (c, label, width)
        wraps = lines > 1 and config[c].get("type_config", {}).get("type") == "text"
        for text in texts[c]:
            if wraps:
                assert widths.wrapped_lines(text, width) <= lines, (c, text, width)
            else:
                assert widths.text_px(text, bold=c in bold) + widths.PADDING_PX <= width, (c, text, width)


def test_the_paper_table_fits_a_1280_px_window_and_shows_no_none(app, mixed):
    """Issue 37: the paper's figures beside the runs drew "None" where the paper prints '-' (the grid draws its
    placeholder for a missing number, whatever the Styler's text) and scrolled sideways at 1280 px."""
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    paper = paper_table(at)
    assert {"run", "maua", "paper_maua", "gb_total", "speedup", "paper_speedup"} <= set(_fits(paper))
    drawn = on_screen(paper)
    assert "None" not in drawn.to_string() and drawn.iloc[0]["paper_maua"] == "—"
    assert_nothing_cut(paper, bold=())  # no marked cells
    caption = texts(at, "caption")
    assert "—: no figure (the paper prints '-'" in caption and "no speed-up for fedcache/homo aaaaa1 (no pfedme" in caption
    assert "Table 5: pfedme" in caption  # the reference method, out of the grid


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_every_table_shows_its_texts_whole(app, mixed):
    """Issue 37: headers and cells cut off ('ot reached' for 'not reached' in a 70 px column): every column of the
    comparison table, the paper's and the Clients tab's is as wide as its header and its longest text."""
    path, ids = mixed
    at = app(FEDCACHE_RESULTS_DB=path)
    at.number_input(key="target").set_value(0.95).run()  # nobody reaches it: 'not reached' in the bytes column
    assert (shown(at.dataframe[0])["bytes_to_target"] == "not reached").all()
    for el in at.dataframe:  # the comparison table (its MAUA and bytes marked bold) and the paper's
        assert_nothing_cut(el, bold=() if "paper_maua" in el.value else ("maua", "bytes_total"))
        assert "None" not in on_screen(el).to_string()
    at.sidebar.multiselect(key="runs").select(ids["killed"]).run()  # a status column, with a long status
    assert_clean(at)
    assert "status" in _fits(at.dataframe[0]) and at.dataframe[0].proto.row_height > 64  # wrapped to fit
    assert_nothing_cut(at.dataframe[0])
    open_tab(at, "Clients")
    assert_clean(at)
    for el in at.dataframe:
        assert_nothing_cut(el, bold=())


def test_params_view_diffs_n_runs(app, sample):
    at = app(tab="Params")
    ids = sample.run_ids
    diff_of = lambda: next(d for d in at.dataframe if "key" in d.value.columns).value.set_index("key")  # noqa: E731
    at.multiselect(key="params_runs").set_value([ids["fedcache"], ids["fedcache_hetero"]]).run()
    diff = diff_of()
    assert {"train.lr", "train.hetero", "run.setting"} <= set(diff.index)
    assert "seed" not in diff.index and len(diff.columns) == 2
    at.multiselect(key="params_runs").set_value([ids["fedcache"], ids["local"]]).run()
    assert diff_of().index.tolist() == ["run.algorithm"]  # same params.yaml, different method
    at.multiselect(key="params_runs").set_value([ids["fedcache"], ids["fedcache_hetero"], ids["local"]]).run()
    diff = diff_of()
    assert len(diff.columns) == 3 and {"run.algorithm", "run.setting", "train.lr"} <= set(diff.index)
    assert len(at.json) == 1
    at.multiselect(key="params_runs").set_value([ids["local"]]).run()
    assert "Pick two or more runs" in texts(at, "caption")


def test_the_pareto_frontier_of_the_selected_runs(app, sample):
    at = app()
    assert_clean(at)
    spec = charts(at)["Accuracy against bytes: the Pareto frontier (filled, labelled)"]
    assert spec["layer"][1]["encoding"]["x"]["scale"]["type"] == "log"
    listed = next(m.value for m in at.markdown if m.value.startswith("**On the frontier**"))
    frontier = [line[2:].rsplit(": ", 1)[0] for line in listed.splitlines() if line.startswith("- ")]
    table = at.dataframe[0].value
    expected = data.pareto_points(table.assign(algorithm=table["run"].str.split("/").str[0]))
    assert frontier == expected.loc[expected["frontier"] & ~expected["tied"], "run"].tolist()  # cheapest first
    assert frontier == ["local/homo bbbbbb"]  # sends nothing: nobody is cheaper (the FedCache runs tie: the band)


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_runs_are_filtered_by_any_param(app, sample):
    at = app()
    ids = sample.run_ids
    key = at.sidebar.selectbox(key="param_key")
    assert key.value is None and "run.setting" in key.options and "seed" not in key.options  # seed never varies here
    key.set_value("run.setting").run()
    values = at.sidebar.multiselect(key="param_values")
    assert set(values.value) == {'"homo"', '"hetero"'}
    values.set_value(['"homo"']).run()
    assert_clean(at)
    offered = at.sidebar.multiselect(key="runs").options
    assert not any("hetero" in o for o in offered) and ids["fedcache_hetero"] not in at.sidebar.multiselect(key="runs").value
    at.sidebar.selectbox(key="param_key").set_value(None).run()
    assert any("hetero" in o for o in at.sidebar.multiselect(key="runs").options)


def test_no_db_empty_db_and_missing_inputs(app, tmp_path):
    at = app(FEDCACHE_RESULTS_DB=tmp_path / "none.duckdb")
    assert_clean(at)
    assert "No results database" in texts(at, "info")

    with ResultsDB(tmp_path / "empty.duckdb").connect():  # the schema, no runs
        pass
    at = app(FEDCACHE_RESULTS_DB=tmp_path / "empty.duckdb")
    assert_clean(at)
    assert "has no runs yet" in texts(at, "info")

    at = app(FEDCACHE_PARTITION_DIR=tmp_path / "nowhere")
    for tab in ("Partition", "Neighbours"):
        open_tab(at, tab)
        assert_clean(at)
        assert "dvc repro partition" in texts(at, "info"), tab


def test_damaged_index_names_the_file_and_the_fix(app, tmp_path):
    path = tmp_path / "results.duckdb"
    path.write_bytes(bytes(range(256)) * 64)  # random bytes, not a DuckDB file
    at = app(FEDCACHE_RESULTS_DB=path)
    assert not at.exception, [e.value for e in at.exception]  # no traceback
    [error] = [e.value for e in at.error]
    assert f"`{path}` is damaged" in error and f"python -m pipeline.results.store rebuild --index {path}" in error


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_a_file_damaged_meanwhile_keeps_the_last_data_on_screen(app, sample, tmp_path):
    """A results file that turns unreadable (mid-write, or broken) leaves the last data on screen with a
    warning naming the file and the fix, instead of blanking every tab; once readable, it is read again."""
    path = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, path)
    at = app(FEDCACHE_RESULTS_DB=path)
    assert len(at.dataframe[0].value) == 3
    good = path.read_bytes()
    path.write_bytes(b"not a database" * 1000)
    at.run()
    assert_clean(at)
    warning = texts(at, "warning")
    assert f"`{path}` is damaged" in warning and f"python -m pipeline.results.store rebuild --index {path}" in warning
    assert "Showing the data read at" in warning
    assert len(at.dataframe[0].value) == 3 and "Mean user accuracy vs round" in charts(at)  # still on screen
    path.write_bytes(good)
    at.run()
    assert_clean(at)
    assert "damaged" not in texts(at, "warning")


def test_run_with_no_rounds(app, sample, tmp_path):
    path = tmp_path / "one.duckdb"
    db = ResultsDB(path)
    db.start_run("fedcache-x-000001", "fedcache", "mnist", "homo", sample_data.params_for(sample.root), "abc")
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    info = texts(at, "info")
    assert "has no rounds yet" in info and "no rounds yet" in info.lower()
    assert not at.dataframe or all("maua" not in d.value.columns for d in at.dataframe)


# Child processes run small scripts (duckdb + pipeline.results.store only: they start in ~0.2 s). Each waits
# for a line on its stdin where the test needs it to hold still: no step depends on timing.
HOLD = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])  # a writer: exclusive lock on the file
print("ready", flush=True)
sys.stdin.readline()  # held until the test says so
con.close()
"""

APPEND = """
import json, sys
from pipeline.results.store import RunResultsDB
path, run_id, last, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
db = RunResultsDB(path, lock_timeout_s=60)  # a training stage: its own results file, the run started there
db.start_run(run_id, "fedcache", "mnist", "homo", json.loads(sys.argv[5]), "abc1234")
for rnd in range(last + 1):  # a training stage's write pattern: per round open, write, close
    acc = 0.1 + 0.05 * rnd
    up, down = (clients * 1000, 0) if rnd == 0 else (clients * 480, clients * 400)
    db.write_round(run_id, rnd, acc, up, down, 0.1, [(k, acc, 20) for k in range(clients)],
                   [(rnd, k, "up", "hashes" if rnd == 0 else "logits", up // clients, -1) for k in range(clients)])
    if rnd % 3 == 1:  # a slow commit: the file stays locked while the app reads
        with db.connect() as con:
            print(f"holding {rnd}", flush=True)
            sys.stdin.readline()
    else:
        print(f"wrote {rnd}", flush=True)
        sys.stdin.readline()
db.finish_run(run_id)
print("done", flush=True)
"""


def child(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=Path(__file__).resolve().parent.parent,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def go_on(proc: subprocess.Popen) -> None:
    """Let a child waiting on its stdin take its next step."""
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.mark.slow  # the file held by another process (real processes: the end-to-end tier)
def test_locked_db_keeps_last_snapshot(app, sample, tmp_path):
    path = tmp_path / "r.duckdb"
    shutil.copy(sample.results_db, path)
    at = app(FEDCACHE_RESULTS_DB=path, FEDCACHE_DB_LOCK_TIMEOUT="0.2")
    assert len(at.dataframe[0].value) == 3
    holder = child(HOLD, path)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        at.run()  # the writer holds the file until told otherwise: longer than the retry window
        assert_clean(at)
        assert "locked by a writer" in texts(at, "warning")
        assert len(at.dataframe[0].value) == 3  # the previous snapshot stays on screen
    finally:
        go_on(holder)
        assert holder.wait(60) == 0
    at.run()
    assert_clean(at)
    assert "locked" not in texts(at, "warning")


@pytest.mark.slow  # a writer in another process (real processes: the end-to-end tier)
def test_concurrent_writer(app, sample, tmp_path):
    """A training stage writing rounds into its own runs/<name>/run.duckdb next to the index: read
    directly (it is newer than the index), its rows replacing the index's for that run."""
    path = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, path)
    old = path.stat().st_mtime_ns - 10**10
    os.utime(path, ns=(old, old))  # the index was built a while ago
    run_id = sample.run_ids["starting"]
    at = app(FEDCACHE_RESULTS_DB=path)
    at.sidebar.multiselect(key="runs").set_value([run_id]).run()
    assert "has no rounds yet" in texts(at, "info")

    last = 2  # round 0 written, round 1 written but held locked, round 2 written
    params = json.dumps(sample_data.params_for(sample.root, beta=2.0))
    writer = child(APPEND, tmp_path / "runs" / "fedcache" / "run.duckdb", run_id, last, sample_data.K, params)
    seen = []
    for rnd in range(last + 1):  # the app reads after each round the writer has written (or while it holds the file)
        line = writer.stdout.readline().strip()
        assert line in (f"wrote {rnd}", f"holding {rnd}"), (line, writer.stderr.read() if not line else "")
        at.run()
        assert_clean(at)
        caption = texts(at, "caption")
        seen.append(int(caption.split("round ")[1].split()[0].rstrip(",")) if "round " in caption else -1)
        if line.startswith("wrote"):
            assert seen[-1] == rnd, (seen, caption)  # the round just written is on screen
        go_on(writer)
    out, err = writer.communicate(timeout=30)
    assert writer.returncode == 0 and out.strip() == "done", err
    at.run()
    assert_clean(at)
    table = at.dataframe[0].value.set_index("run_id")
    assert table.at[run_id, "rounds"] == last and table.at[run_id, "status"] == "finished"
    # rounds appeared while the writer ran; the round it held locked left the last one on screen
    assert seen == [0, 0, 2], seen


@pytest.fixture
def downloads(monkeypatch):
    """filename -> bytes of every file the app hands to a download button (AppTest's media storage)."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    files: dict[str, bytes] = {}
    original = MemoryMediaFileStorage.load_and_get_id

    def record(self, path_or_data, mimetype, kind, filename=None):
        files[filename] = path_or_data
        return original(self, path_or_data, mimetype, kind, filename)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", record)
    return files


@pytest.mark.slow  # a sequence of app runs: the end-to-end tier (the unit tier draws each view)
def test_seeds_are_grouped_into_bands_and_curves_download_as_csv(app, sample, tmp_path, downloads):
    path = tmp_path / "seeds.duckdb"
    ids = sample_data.write_seed_runs(ResultsDB(path), sample.root)
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    assert at.sidebar.toggle(key="group_seeds").value  # 3 runs differ only in their seed: on by default
    table = shown(at.dataframe[0])
    assert len(table) == 2  # the seed group and the local run
    fed = table.set_index("group").loc["fedcache/homo seed00 (3 seeds)"]
    assert re.fullmatch(r"\d+\.\d% \[\d+\.\d, \d+\.\d\] \(3 seeds\)", fed["maua"])  # a 95% interval over the seeds
    assert fed["bytes_to_target"].endswith("(3 seeds)")
    local = table.set_index("group").loc["local/homo ffffff"]
    assert local["speedup"] == "no bytes sent" and "speedup_vs" in table.columns  # not 'not reached'; the 'vs' kept
    means = at.dataframe[0].value.set_index("group")  # sorting by the means
    assert means.at["fedcache/homo seed00 (3 seeds)", "maua"] == pytest.approx(
        sum(max(sample_data.curve(0.80 + 0.01 * i)) for i in range(3)) / 3)
    spec = charts(at)["Mean user accuracy vs round"]
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["area", "line"]
    band = frame(spec)
    assert set(band["run"]) == {"fedcache/homo seed00 (3 seeds)", "local/homo ffffff"}
    assert (band.query("run != 'local/homo ffffff'")["n"] == 3).all()

    # the curves of every selected run, one row per run and round
    assert "Curves (CSV)" in [b.label for b in at.get("download_button")]
    curves = pd.read_csv(io.BytesIO(downloads["curves.csv"]))
    assert list(curves.columns) == ["run", "run_id", "algorithm", "round", "mean_acc", "cum_bytes"]
    assert set(curves["run_id"]) == set(ids.values()) and len(curves) == 4 * (sample_data.ROUNDS + 1)
    first = curves[curves["run_id"] == ids[0]]
    assert first["mean_acc"].tolist() == pytest.approx(sample_data.curve(0.80))
    assert first["cum_bytes"].is_monotonic_increasing and first["algorithm"].eq("fedcache").all()

    at.sidebar.toggle(key="group_seeds").set_value(False).run()  # one row and one line per run again
    assert_clean(at)
    assert len(at.dataframe[0].value) == 4 and "(3 seeds)" not in at.dataframe[0].value.to_string()
    assert charts(at)["Mean user accuracy vs round"]["mark"]["type"] == "line"
    at.sidebar.multiselect(key="runs").set_value([ids[0], ids[-1]]).run()  # the user's choice sticks
    assert not at.sidebar.toggle(key="group_seeds").value


def test_group_seeds_with_one_seed_per_group_shows_every_run_on_its_own(app):
    at = app()
    at.sidebar.toggle(key="group_seeds").set_value(True).run()  # no two runs differ only in their seed
    assert_clean(at)
    assert "every run is shown on its own" in texts(at, "caption")
    table = shown(at.dataframe[0])
    assert "run" in table.columns and "speedup_vs" in table.columns  # the per-run table, its 'vs' included
    assert table.loc[table["algorithm"] == "local", "speedup"].tolist() == ["no bytes sent"]
    assert charts(at)["Mean user accuracy vs round"]["mark"]["type"] == "line"  # one line per run, with its legend


@pytest.fixture
def deferred(monkeypatch):
    """filename -> (callable, mime) of every download button whose file is made on click (deferred)."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    files: dict[str, tuple] = {}
    original = MediaFileManager.add_deferred

    def record(self, data_callable, mimetype, coordinates, file_name=None, **kwargs):
        files[file_name] = (data_callable, mimetype)
        return original(self, data_callable, mimetype, coordinates, file_name, **kwargs)

    monkeypatch.setattr(MediaFileManager, "add_deferred", record)
    return files


@pytest.mark.slow  # renders each chart with vl-convert (a JavaScript engine)
def test_overview_charts_download_as_svg_and_pdf_made_on_click(app, deferred, monkeypatch):
    from dashboard import export

    rendered = []
    real = export.chart_bytes
    monkeypatch.setattr(export, "chart_bytes", lambda chart, fmt: rendered.append(fmt) or real(chart, fmt))
    at = app()
    assert_clean(at)
    labels = [b.label for b in at.get("download_button")]
    assert labels.count("SVG") == 3 and labels.count("PDF") == 3  # the two curves and the Pareto chart
    assert rendered == []  # drawing the page renders no file: only a click does
    for name in ("accuracy_vs_round", "accuracy_vs_bytes"):
        make, mime = deferred[f"{name}.svg"]
        svg = make()
        assert svg.startswith(b"<svg") and mime == "image/svg+xml"
        assert b"Mean user accuracy vs" in svg and b"fedcache/homo aaaaaa" in svg  # title and legend as text
        make, mime = deferred[f"{name}.pdf"]
        assert make().startswith(b"%PDF") and mime == "application/pdf"
    assert rendered == ["svg", "pdf"] * 2
    for name in ("accuracy_vs_bytes", "pareto_maua_vs_bytes"):
        ticks = re.findall(rb">([0-9.]+[KMGT]?B)<", deferred[f"{name}.svg"][0]())
        assert ticks and all(re.fullmatch(rb"10*[KMGT]?B", t) for t in ticks), ticks  # decades only: no '2MB3MB'
    assert b"fedcache/homo aaaaaa" in deferred["pareto_maua_vs_bytes.svg"][0]()  # the frontier's labels as text

    at.radio(key="acc_x").set_value("time").run()  # the file follows the chart on screen
    assert b"wall-clock time" in deferred["accuracy_vs_time.svg"][0]()


def test_a_file_made_on_click_outlives_the_script_runs_after_it(monkeypatch):
    """Issue 37 (one click downloads): Streamlit stores a deferred download's file under no element, and every
    script run ends by marking such a file for deletion, then deleting it; the auto-refresh's check is a script run
    (every second in the browser test), so a browser slower than two checks to fetch the file got an error page
    named by its hash. export.keep_served keeps the file until that button's next click."""
    from unittest.mock import MagicMock

    import altair as alt
    from streamlit.runtime import Runtime
    from streamlit.runtime.media_file_manager import MediaFileManager
    from streamlit.runtime.media_file_storage import MediaFileStorageError
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    from dashboard import export

    storage = MemoryMediaFileStorage("/media")
    manager = MediaFileManager(storage)
    monkeypatch.setattr(Runtime, "_instance", MagicMock(spec=Runtime, media_file_mgr=manager))
    chart = alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_line().encode(x="x:Q", y="x:Q")
    served = {}
    for name, make in (("kept.svg", export.chart_file(chart, "svg", "kept.svg")),
                       ("unkept.svg", export.chart_file(chart, "svg"))):  # as before: no name to keep it under
        url = manager.execute_deferred(manager.add_deferred(make, "image/svg+xml", f"button {name}", name))
        manager.remove_orphaned_files()  # two script runs end (two auto-refresh checks)
        manager.remove_orphaned_files()
        served[name] = url.rsplit("/", 1)[-1]
    assert storage.get_file(served["kept.svg"]).content.startswith(b"<svg")
    with pytest.raises(MediaFileStorageError):
        storage.get_file(served["unkept.svg"])
    # the next file made under that name replaces it: one kept per button
    chart2 = alt.Chart(pd.DataFrame({"x": [1, 3]})).mark_line().encode(x="x:Q", y="x:Q")
    url = manager.execute_deferred(manager.add_deferred(export.chart_file(chart2, "svg", "kept.svg"), "image/svg+xml",
                                                        "button kept.svg", "kept.svg"))
    manager.remove_orphaned_files()
    manager.remove_orphaned_files()
    assert storage.get_file(url.rsplit("/", 1)[-1])
    with pytest.raises(MediaFileStorageError):
        storage.get_file(served["kept.svg"])


def test_without_vl_convert_the_charts_say_how_to_get_svg_and_pdf(app, monkeypatch):
    from dashboard import export

    monkeypatch.setattr(export, "available", lambda: False)
    at = app()
    assert_clean(at)
    assert "SVG" not in [b.label for b in at.get("download_button")]
    assert f"pip install {export.PACKAGE}" in texts(at, "caption")


@pytest.fixture
def ablations(sample, tmp_path):
    """(results DB, ids) of sample_data.write_ablation_runs: the alpha and R sweeps' runs (FedCache, FD)."""
    path = tmp_path / "ablations.duckdb"
    return path, sample_data.write_ablation_runs(ResultsDB(path), sample.root)


def test_ablations_tab_draws_maua_and_bytes_against_each_swept_key(app, ablations, sample):
    path, ids = ablations
    at = app(FEDCACHE_RESULTS_DB=path, tab="Ablations")
    assert_clean(at)
    ch = charts(at)
    for key, values in sample_data.ABLATIONS.items():
        maua, sent = ch[f"MAUA vs {key}"], ch[f"Bytes communicated vs {key}"]
        points = frame(maua).sort_values(["line", "value"])
        assert points["value"].tolist() == [float(v) for v in values] * 2 and \
            points["line"].tolist() == ["fd"] * 3 + ["fedcache"] * 3
        for row in points.itertuples():
            finals = [sample_data.ablation_final(key, row.value, row.line)]
            if (key, row.value, row.line) == ("partition.alpha", 3.0, "fedcache"):  # two seeds: their mean
                finals.append(finals[0] + 0.02)
            assert row.maua == pytest.approx(sum(max(sample_data.curve(f)) for f in finals) / len(finals))
        assert scale(maua) == scale(sent) == {"fd": charts_mod.METHOD_COLORS["fd"],
                                              "fedcache": charts_mod.METHOD_COLORS["fedcache"]}
        assert maua["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"  # R 1-16, alpha 1-10: a decade or more
        # every point carries its MAUA interval, drawn as a bar from low to high
        assert (points["maua_low"] < points["maua_high"]).all()
        assert maua["layer"][1]["encoding"]["y"]["field"] == "maua_low"
        assert maua["layer"][1]["encoding"]["y2"]["field"] == "maua_high"
        y = sent["encoding"]["y"]
        assert y["scale"]["type"] == "log" and "B'" in y["axis"]["labelExpr"]
        assert (frame(sent)["bytes"] > 0).all()
    assert "Also changed against params.yaml: train.algorithms" in texts(at, "caption")
    assert "MAUA vs seed" not in ch  # the seeds sweep repeats a configuration: no ablation

    at = app(tab="Ablations")  # results without sweep runs: what to run
    assert_clean(at)
    assert "python -m pipeline.experiments.sweeps run ablation_alpha" in texts(at, "caption")
    assert not [t for t in charts(at) if t.startswith("MAUA vs")]


def paper_table(at: AppTest):
    return next(d for d in at.dataframe if "paper_maua" in d.value.columns)


def test_the_overview_shows_the_papers_figures_beside_the_selected_runs(app, mixed):
    path, ids = mixed  # MNIST runs: FedCache is in the paper's Table 5 (its MAUA printed as '-'), FedAvg and local not
    at = app(FEDCACHE_RESULTS_DB=path)
    assert "Beside the FedCache paper" in [h.value for h in at.subheader]
    paper = paper_table(at).value
    assert paper["run_id"].tolist() == [ids["fedcache"]] and paper["table"].tolist() == [5]
    assert paper["reference"].tolist() == ["pfedme"] and paper["paper_maua"].isna().all()
    on_screen = shown(paper_table(at))
    assert "None" not in on_screen.to_string() and "nan" not in on_screen.to_string()
    row = on_screen.iloc[0]
    assert row["paper_maua"] == "— (the paper prints '-')"  # a reason, not None
    assert row["speedup"] == "— (no pfedme run selected)"
    assert row["gb_total"].endswith((" KB", " MB"))  # a tiny run's bytes with their unit, not "0.000" GB


def run_record(at: AppTest) -> dict[str, str]:
    """The Params tab's run record (a Markdown table: what -> value)."""
    text = next(m.value for m in at.markdown if m.value.startswith("**Run record**"))
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")][1:]
    return {what.strip(): value.strip() for what, value in rows}


def test_the_run_record_says_where_a_run_ran(app, sample, tmp_path):
    """Issue 37: one run's record in the Params tab: what ran and when, git and the DVC experiment, the device and
    threads its params asked for, and where it ran (the command, package versions, CPU, GPU, torch threads and
    device: runs.environment, as a training stage records it; sample_data.ENVIRONMENT on the FedCache homo run),
    "not recorded" for a run without one; with its stage's summary.json (its seconds by part) when that is this
    run's."""
    ids = sample.run_ids
    (tmp_path / "fedcache").mkdir()
    (tmp_path / "fedcache" / "summary.json").write_text(json.dumps(
        {"run_id": ids["fedcache"], "seconds": {"startup": 3.25, "train": 40.5}}))
    at = app(FEDCACHE_RUNS_DIR=tmp_path, tab="Params")
    at.selectbox(key="params_one").set_value(ids["fedcache"]).run()
    assert_clean(at)
    record = run_record(at)
    env = sample_data.ENVIRONMENT
    assert record["command"] == env["command"] and record["Python"] == env["python"]
    assert record["working directory"] == env["cwd"] and record["platform"] == env["platform"]
    assert record["packages"] == "torch 2.5.1, numpy 2.1.3, duckdb 1.1.3 (not installed: faiss-cpu)"
    assert record["CPU"] == env["cpu"] and record["GPU"] == env["gpu"]
    assert record["torch threads"] == "4" and record["torch device"] == "cuda:0"
    assert record["run id"] == ids["fedcache"] and record["git revision"] == "abc1234"
    assert record["threads asked (train.threads)"] == "the executor's default" and record["device asked (device)"] == "—"
    assert record["rounds written"] == f"{sample_data.ROUNDS + 1} (last: {sample_data.ROUNDS})"
    assert record["wall-clock s (rounds)"] == f"{0.5 * (sample_data.ROUNDS + 1):,.1f}"
    assert record["seconds, by part (summary.json)"] == "startup 3.25, train 40.5"
    assert "hold no record of where this run ran" not in texts(at, "caption")

    at.selectbox(key="params_one").set_value(ids["local"]).run()  # a run without one: said so
    assert_clean(at)
    record = run_record(at)
    assert record["command"] == record["packages"] == record["GPU"] == "not recorded"
    assert "seconds, by part (summary.json)" not in record  # the summary is another run's
    assert "hold no record of where this run ran" in texts(at, "caption")

    # as the pipeline records it (pipeline.machine.run_environment and the engine's additions), on the CPU
    from pipeline.machine import run_environment

    db = ResultsDB(tmp_path / "recorded.duckdb")
    environment = {**run_environment(), "torch_threads": 2, "device": "cpu", "gpu": None}
    sample_data.write_run(db, "fedavg-20260801-000000-record", "fedavg", "homo", sample_data.params_for(sample.root),
                          np.full(sample_data.K, sample_data.PER_CLIENT), sample_data.curve(0.7), environment=environment)
    at = app(FEDCACHE_RESULTS_DB=db.path, tab="Params")
    assert_clean(at)
    record = run_record(at)
    assert record["command"] == environment["command"] and record["CPU"] == environment["cpu"]
    assert record["GPU"] == "none" and record["torch device"] == "cpu" and record["torch threads"] == "2"
    assert all(f"{name} {v}" in record["packages"] for name, v in environment["packages"].items() if v)


def test_a_damaged_index_beside_intact_run_files_shows_them_with_a_warning(app, tmp_path):
    from pipeline.results.store import RunResultsDB

    for name in ("fedcache", "local"):
        run = RunResultsDB(tmp_path / "runs" / name / "run.duckdb")
        run.start_run(f"{name}-1", name, "mnist", "homo", {}, "abc")
        for r in range(3):
            run.write_round(f"{name}-1", r, 0.3 + 0.1 * r, 10, 10, 1.0, [(0, 0.3 + 0.1 * r, 10)], [], {})
        run.finish_run(f"{name}-1")
    index = tmp_path / "results.duckdb"
    index.write_bytes(b"not a database" * 1000)
    at = app(FEDCACHE_RESULTS_DB=index)
    assert_clean(at)
    assert not at.error
    warning = texts(at, "warning")
    assert f"`{index}` is damaged" in warning and "showing the 2 per-run files" in warning
    assert sorted(at.dataframe[0].value["run_id"]) == ["fedcache-1", "local-1"]


def test_a_link_reproduces_the_view_and_the_view_follows_the_link(app, sample):
    """Selection, target and baseline are query parameters: a new session opened on them shows that view."""
    local = sample.run_ids["local"]
    at = app(run=False)
    at.query_params = {"runs": [sample.run_ids["fedcache"], local], "target": "0.55", "baseline": ""}
    at.run()
    assert_clean(at)
    assert at.sidebar.multiselect(key="runs").value == [sample.run_ids["fedcache"], local]
    assert at.number_input(key="target").value == pytest.approx(0.55)
    assert at.sidebar.selectbox(key="baseline").value == ""
    at.number_input(key="target").set_value(0.6).run()  # the URL follows the view
    assert at.query_params["target"] == "0.6" and at.query_params["runs"] == [sample.run_ids["fedcache"], local]


@pytest.mark.slow  # a dozen reruns and new sessions (the unit tier keeps test_a_link_reproduces_the_view...)
def test_a_link_keeps_smoothing_axis_filters_seed_grouping_and_setup(app, sample):
    """Issue 37: the smoothing, the accuracy chart's x axis, the filters (settings, algorithms, a param and its
    values), seed grouping and the set-up toggle are query parameters too: each change is written into the URL,
    and a new session opened on that URL shows the same view."""
    ids = sample.run_ids
    at = app()
    assert {"smoothing": "0", "x": "round", "setup": "1", "seeds": "0"}.items() <= at.query_params.items()
    assert not {"filter", "value", "setting", "algorithm"} & set(at.query_params)  # nothing narrowed
    at.slider(key="smoothing").set_value(0.6).run()
    at.radio(key="acc_x").set_value("time").run()
    at.sidebar.toggle(key="include_setup").set_value(False).run()
    at.sidebar.toggle(key="group_seeds").set_value(True).run()
    at.sidebar.multiselect(key="algorithms").set_value(["fedcache"]).run()
    at.sidebar.selectbox(key="param_key").set_value("train.lr").run()
    at.sidebar.multiselect(key="param_values").set_value(["0.01"]).run()
    assert_clean(at)
    link = dict(at.query_params)
    expected = {"smoothing": "0.6", "x": "time", "setup": "0", "seeds": "1", "filter": "train.lr"}
    assert expected.items() <= link.items(), link
    assert list(np.atleast_1d(link["value"])) == ["0.01"] and list(np.atleast_1d(link["algorithm"])) == ["fedcache"]
    assert list(np.atleast_1d(link["runs"])) == [ids["fedcache"]]  # the only FedCache run with train.lr 0.01 left

    opened = app(run=False)  # the link, in a new session
    opened.query_params = link
    opened.run()
    assert_clean(opened)
    assert opened.slider(key="smoothing").value == pytest.approx(0.6)
    assert opened.radio(key="acc_x").value == "time"
    assert opened.sidebar.toggle(key="include_setup").value is False
    assert opened.sidebar.toggle(key="group_seeds").value is True
    assert opened.sidebar.multiselect(key="algorithms").value == ["fedcache"]
    assert opened.sidebar.multiselect(key="settings").value == ["hetero", "homo"]  # not narrowed: all
    assert opened.sidebar.selectbox(key="param_key").value == "train.lr"
    assert opened.sidebar.multiselect(key="param_values").value == ["0.01"]
    assert opened.sidebar.multiselect(key="runs").value == [ids["fedcache"]]
    assert "Mean user accuracy vs wall-clock time" in charts(opened)
    assert opened.dataframe[0].value.set_index("run_id").at[ids["fedcache"], "bytes_to_target"] < \
        app().dataframe[0].value.set_index("run_id").at[ids["fedcache"], "bytes_to_target"]  # set-up left out
    for key, value in expected.items():  # and it writes the same view back
        assert opened.query_params[key] == value, key

    narrowed = app(run=False)  # a link narrowing the settings; values a link cannot mean are ignored
    narrowed.query_params = {"setting": "homo", "x": "sideways", "smoothing": "7", "seeds": "maybe",
                             "filter": "no.such.key"}
    narrowed.run()
    assert_clean(narrowed)
    assert narrowed.sidebar.multiselect(key="settings").value == ["homo"]
    assert ids["fedcache_hetero"] not in narrowed.sidebar.multiselect(key="runs").value
    assert narrowed.radio(key="acc_x").value == "round" and narrowed.slider(key="smoothing").value == 0
    assert narrowed.sidebar.selectbox(key="param_key").value is None and "filter" not in narrowed.query_params
    assert narrowed.query_params["setting"] in ("homo", ["homo"])


@pytest.mark.slow  # a sequence of clicks and new sessions (the unit tier keeps test_only_the_open_tab_runs)
def test_a_click_on_a_tab_writes_it_into_the_url_and_a_link_opens_it(app, sample):
    """The open tab is a query parameter too (?tab=Cache): written when a tab is clicked, read by a new
    session, kept while the sidebar changes the rest of the URL."""
    at = app()
    assert "tab" not in at.query_params and at.session_state["tab"] == TABS[0]
    click_tab(at, "Cache")
    assert_clean(at)
    assert at.query_params["tab"] == "Cache" and at.session_state["tab"] == "Cache"
    assert set(CACHE_TITLES.values()) <= set(charts(at))  # the Cache tab's content, drawn by the click's rerun
    at.sidebar.multiselect(key="runs").set_value([sample.run_ids["fedcache"]]).run()
    assert at.query_params["tab"] == "Cache" and at.session_state["tab"] == "Cache"  # still open, still in the URL
    at.sidebar.multiselect(key="runs").set_value([]).run()  # no run, no tabs: the URL keeps the tab for later
    at.sidebar.multiselect(key="runs").set_value([sample.run_ids["fedcache"]]).run()
    assert at.session_state["tab"] == "Cache" and set(CACHE_TITLES.values()) == set(charts(at))
    click_tab(at, "Accuracy & bytes")
    assert at.query_params["tab"] == "Accuracy & bytes" and "Mean user accuracy vs round" in charts(at)
    # a request that left the browser before the click's new address arrived (an auto-refresh check that reruns
    # the page) carries the old one, and every request resets the server's query parameters to what it carries:
    # the URL must still name the open tab after it (CI, stop 54: it named Cache while Params was open)
    at.query_params["tab"] = "Cache"
    at.run()
    assert at.session_state["tab"] == "Accuracy & bytes" and at.query_params["tab"] == "Accuracy & bytes"

    opened = app(run=False)  # the link, in a new session
    opened.query_params = {"runs": [sample.run_ids["fedcache"]], "tab": "Cache"}
    opened.run()
    assert_clean(opened)
    assert opened.session_state["tab"] == "Cache" and set(CACHE_TITLES.values()) == set(charts(opened))
    opened.sidebar.toggle(key="include_setup").set_value(False).run()  # the tab stays open across reruns
    assert opened.session_state["tab"] == "Cache" and opened.query_params["tab"] == "Cache"

    unknown = app(run=False)  # a tab that is no more: the first one
    unknown.query_params = {"tab": "Nope"}
    unknown.run()
    assert_clean(unknown)
    assert unknown.session_state["tab"] == TABS[0] and "Mean user accuracy vs round" in charts(unknown)


def test_only_the_open_tab_runs(app, monkeypatch):
    """The other tabs' views do not run (nor read the partition's stats) until their tab is opened."""
    from dashboard import stages, tabs, views

    ran = []
    for module in (views, tabs):
        for name in [n for n in dir(module) if n.startswith("view_") and getattr(module, n).__module__ == module.__name__]:
            real = getattr(module, name)
            monkeypatch.setattr(module, name,
                                lambda *a, _real=real, _name=name, **kw: ran.append(_name) or _real(*a, **kw))
    real_stats = stages.load_stats
    monkeypatch.setattr(stages, "load_stats", lambda *a, **kw: ran.append("load_stats") or real_stats(*a, **kw))
    at = app()
    assert_clean(at)
    assert ran == ["view_overview"]
    assert not set(CACHE_TITLES.values()) & set(charts(at))  # the Cache tab's charts are not made
    assert len(at.tabs) == len(TABS) and not any(tab.children for tab in at.tabs[1:])
    for tab, expected in (("Cache", ["view_cache"]), ("Privacy", ["view_privacy"]),
                          ("Clients", ["load_stats", "view_clients"]),
                          ("Partition", ["load_stats", "view_partition"]), ("Neighbours", ["view_neighbours"]),
                          ("Params", ["view_params"])):
        ran.clear()
        open_tab(at, tab)
        assert_clean(at)
        assert ran == expected, tab
        assert [t.label for t in at.tabs if t.children] == [tab]


def test_a_new_run_with_another_set_up_is_announced_not_added(app, sample, tmp_path):
    path = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, path)
    at = app(FEDCACHE_RESULTS_DB=path)
    before = at.sidebar.multiselect(key="runs").value
    db = ResultsDB(path)
    other = sample_data.params_for(sample.root)
    other["partition"]["num_clients"] = 2 * sample_data.K  # another set-up
    db.start_run("fedcache-other", "fedcache", "mnist", "homo", other, "abc")
    db.write_round("fedcache-other", 0, 0.1, 10, 10, 1.0, [(0, 0.1, 10)], [], {})
    same = sample_data.params_for(sample.root)
    db.start_run("local-same", "local", "mnist", "homo", same, "abc")
    db.write_round("local-same", 0, 0.1, 0, 0, 1.0, [(0, 0.1, 10)], [], {})
    at.run()
    assert_clean(at)
    chosen = at.sidebar.multiselect(key="runs").value
    assert "fedcache-other" not in chosen and chosen == [*before, "local-same"]  # the same set-up joins
    assert "with another set-up (not added)" in texts(at.sidebar, "info") and "fedcache/homo" in texts(at.sidebar, "info")
    assert "not directly comparable" not in texts(at, "warning")


@pytest.mark.slow  # replays a browser's sequence of requests, rerun by rerun
def test_a_run_the_app_adds_survives_a_request_sent_before_the_browser_drew_it(app, sample, tmp_path):
    """Issue 37 (refreshes swallowing input): every request carries all widget values, so an auto-refresh check the
    browser sent before it drew a run the app had just added to the selection carried the old selection, and the
    run was dropped for good (1 in 7 live runs in the browser test, on a busy machine). The addition now waits
    until the browser sends it back, and a request with the old selection until then puts it back; after that, a
    user's removal stands."""
    path = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, path)
    at = app(FEDCACHE_RESULTS_DB=path)
    before = at.sidebar.multiselect(key="runs").value
    db = ResultsDB(path)
    db.start_run("fedcache-new", "fedcache", "mnist", "homo", sample_data.params_for(sample.root), "abc")
    db.write_round("fedcache-new", 0, 0.1, 10, 10, 1.0, [(0, 0.1, 10)], [], {})
    at.run()
    assert at.sidebar.multiselect(key="runs").value == [*before, "fedcache-new"]  # the app adds it
    at.sidebar.multiselect(key="runs").set_value(before).run()  # a request sent before the browser drew it
    assert_clean(at)
    assert at.sidebar.multiselect(key="runs").value == [*before, "fedcache-new"]  # put back
    at.run()  # the browser sends it back: seen
    at.sidebar.multiselect(key="runs").set_value(before).run()  # now the user removes it
    assert at.sidebar.multiselect(key="runs").value == before
    at.run()
    assert at.sidebar.multiselect(key="runs").value == before and "fedcache-new" not in at.query_params["runs"]


def test_the_smoothing_slider_smooths_the_curves_not_the_table(app):
    at = app()
    maua = at.dataframe[0].value["maua"].tolist()
    raw = frame(charts(at)["Mean user accuracy vs round"])
    at.slider(key="smoothing").set_value(0.6).run()
    assert_clean(at)
    drawn = frame(charts(at)["Mean user accuracy vs round"])
    assert drawn["mean_acc_raw"].tolist() == pytest.approx(raw["mean_acc"].tolist())
    assert drawn["mean_acc"].tolist() != pytest.approx(raw["mean_acc"].tolist())
    assert at.dataframe[0].value["maua"].tolist() == maua  # MAUA from the measured rounds
