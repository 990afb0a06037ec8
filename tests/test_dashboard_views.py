"""Single views called directly (Streamlit in bare mode: its calls draw nothing and return), and the overview's
95% intervals and ties through Streamlit's AppTest (the app on dashboard.sample_data's runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from dashboard import data, sample_data, stages, tabs, views
from dashboard.config import Config
from pipeline.data.partition import make_partition, partition_stats, write_stats
from pipeline.results.store import ResultsDB


@pytest.fixture
def drawn_mixes(monkeypatch):
    """The label mixes the partition view hands to its heatmap."""
    mixes = []
    real = tabs.charts.label_heatmap

    def record(mix):
        mixes.append(mix)
        return real(mix)

    monkeypatch.setattr(tabs.charts, "label_heatmap", record)
    return mixes


def _config(tmp_path) -> Config:
    return Config(results_db=tmp_path / "results.duckdb", partition_dir=tmp_path / "partition", cache_db=None,
                  data_root=None, refresh_s=0)


def test_partition_view_reads_the_stats_it_was_not_given(tmp_path, synthetic_labels, default_params_raw,
                                                         drawn_mixes):
    # The app passes stats=None when the file was missing as it started; if it exists by the time the
    # view draws, the view reads it and draws it (it used to drop what it read and fail on None).
    from pipeline.config import parse_params

    cfg = _config(tmp_path)
    default_params_raw["partition"].update(num_clients=4, samples_per_client=50)
    p = parse_params(default_params_raw).partition
    train_y, test_y = synthetic_labels
    write_stats(partition_stats(make_partition(train_y, test_y, 10, p, 0)), cfg.stats_path)
    tabs.view_partition(cfg, None, {"data": {"dataset": "mnist"}})
    assert len(drawn_mixes) == 1
    mix = drawn_mixes[0]
    assert len(mix) == 4 * 10 and mix["count"].sum() == 200


def test_partition_view_without_stats_says_what_to_run(tmp_path, drawn_mixes):
    with pytest.raises(stages.InputMissing, match="dvc repro partition"):
        tabs.view_partition(_config(tmp_path), None, {})
    assert drawn_mixes == []


# ---------------------------------------------------------------------------- the app, through AppTest: intervals, ties

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
INTERVAL = r"\d+(\.\d+)?% \[\d+(\.\d+)?, \d+(\.\d+)?\]"  # '80% [74, 84]', '64.6% [62.9, 66.6]' (intervals.percent)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return sample_data.build_once(tmp_path_factory.getbasetemp() / "dashboard_sample")  # shared, read-only


@pytest.fixture
def app(sample, monkeypatch, repo_root):
    """app(runs=None, **env) -> a run AppTest on the sample inputs (env on top; runs: ?runs= of the link)."""
    monkeypatch.chdir(repo_root)

    def _make(runs: list[str] | None = None, **env) -> AppTest:
        for k, v in {**sample.env(), "FEDCACHE_DASHBOARD_REFRESH": "0", **env}.items():
            monkeypatch.setenv(k, str(v))
        at = AppTest.from_file(APP, default_timeout=90)
        if runs:
            at.query_params = {"runs": runs}
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.error, [e.value for e in at.error]
        return at

    return _make


def _shown(el) -> pd.DataFrame:
    """The text a dataframe element shows (its Styler's display values)."""
    return convert_arrow_bytes_to_pandas_df(el.proto.arrow_data.styler.display_values)


def _styled(el) -> dict[str, set[tuple[int, str]]]:
    """CSS -> the (row, column) cells a dataframe element's Styler gives it."""
    styler, columns = el.proto.arrow_data.styler, list(el.value.columns)
    out: dict[str, set] = {}
    for cells, css in re.findall(r"([^{}]+)\{\s*([^{}]*?)\s*\}", styler.styles):
        for row, col in re.findall(rf"#T_{styler.uuid}_row(\d+)_col(\d+)", cells):
            out.setdefault(css.strip().rstrip(";"), set()).add((int(row), columns[int(col)]))
    return out


def _markdown(at: AppTest, start: str) -> str:
    return next((m.value for m in at.markdown if m.value.startswith(start)), "")


def _captions(at: AppTest) -> str:
    return "\n".join(c.value for c in at.caption)


def test_two_tied_runs_show_intervals_and_the_page_says_tied(app, sample, tmp_path):
    """write_tied_runs' two runs (0.2 points apart, clients 8 points apart) opened by a link: the table shows
    MAUA and final accuracy with their 95% interval, the paired-differences table says "tied", both MAUA cells
    carry the tied mark (no best mark), the caption says "tied", and the Pareto list puts both on the frontier's
    band, neither "On the frontier", and no text about them says "best" or "on the frontier". Defects it
    catches: bare percentages, a winner crowned by its estimate (the best mark on one run, no "tied" in the
    caption), a frontier that drops the lower estimate, a caption calling one of them best."""
    path = tmp_path / "tied.duckdb"
    ids = sample_data.write_tied_runs(ResultsDB(path), sample.root)
    at = app(runs=[ids["fedcache"], ids["variant"]], FEDCACHE_RESULTS_DB=path)
    table = at.dataframe[0]
    shown = _shown(table).set_index("run_id")
    for rid in ids.values():
        assert re.fullmatch(INTERVAL, shown.at[rid, "maua"]) and re.fullmatch(INTERVAL, shown.at[rid, "final_acc"])
    differences = _markdown(at, "**Paired differences**")
    rows = [line for line in differences.splitlines() if line.startswith("| fedcache")]
    assert len(rows) == 1 and rows[0].endswith("| tied |") and "| fedcache/homo tieda1 |" in rows[0]
    assert re.search(r"\| [+-]\d+ \[-\d+, \+\d+\] \|", rows[0])  # the difference, with an interval around 0
    styled = _styled(table)
    assert styled.get(data.TIED) == {(0, "maua"), (1, "maua")}
    assert not any(col == "maua" for cell in styled.get(data.BEST, ()) for col in cell[1:])
    assert "Highest MAUA: tied between fedcache/homo tieda1, fedcache (beta=2.0)/homo tiedb2" in _captions(at)
    assert _markdown(at, "**On the frontier**") == ""
    band = _markdown(at, "**Tied (the frontier's band)**")
    assert "- fedcache/homo tieda1: " in band and "- fedcache (beta=2.0)/homo tiedb2: " in band
    said = "\n".join([band, *(c.value for c in at.caption if "tied" in c.value)]).lower()
    assert "on the frontier" not in said and "best" not in said  # no word crowns either of two tied runs


def test_the_sample_says_ahead_where_the_intervals_part_and_tied_where_they_do_not(app, sample):
    """The sample's three runs: FedCache is "ahead" of local-only in the differences table (16 points, its interval
    clear of 0), local-only (no bytes) is on the frontier, and the two FedCache runs (homo 80%, hetero 72%, 6
    clients each) are tied: both marked alike, both on the frontier's band, the Pareto chart's points too.
    Defects it catches: a verdict shown without its interval's sign ("tied" for FedCache vs local), the
    frontier by the estimates (hetero off it)."""
    at = app()
    differences = _markdown(at, "**Paired differences**")
    assert re.search(r"\| fedcache/homo aaaaaa \| local/homo bbbbbb \| 1 \| \+\d+ \[\+\d+, \+\d+\] \| ahead \|",
                     differences), differences
    assert re.fullmatch(r"\*\*On the frontier\*\*[^\n]*\n\n- local/homo bbbbbb: 64\.6% \[62\.9, 66\.6\], 0 B",
                        _markdown(at, "**On the frontier**"))
    band = _markdown(at, "**Tied (the frontier's band)**")
    assert "- fedcache/homo aaaaaa: 80% [74, 84]" in band and "- fedcache/hetero cccccc: 72% [68, 78]" in band
    table = at.dataframe[0]
    runs = table.value["run"].tolist()
    assert {runs[r] for r, _ in _styled(table)[data.TIED]} == {"fedcache/homo aaaaaa", "fedcache/hetero cccccc"}
    spec = next(json.loads(c.proto.spec) for c in at.get("vega_lite_chart")
                if "Pareto" in json.dumps(json.loads(c.proto.spec).get("title")))
    points = pd.concat([convert_arrow_bytes_to_pandas_df(d.data.data) for d in
                        next(c for c in at.get("vega_lite_chart") if "Pareto" in c.proto.spec).proto.datasets])
    assert dict(zip(points["run"], points["status"])) == {"local/homo bbbbbb": "frontier",
                                                          "fedcache/homo aaaaaa": "tied",
                                                          "fedcache/hetero cccccc": "tied"}
    bars = [layer for layer in spec["layer"] if layer["mark"]["type"] == "rule" and "y2" in layer["encoding"]]
    assert [b["encoding"]["y2"]["field"] for b in bars] == ["maua_high"]  # the MAUA's interval as error bars


def test_seed_groups_report_intervals_across_seeds(app, sample, tmp_path):
    """Group seeds on: FedCache's 3 seeds and local-only's 3 seeds are two rows whose MAUA carries a 95% interval
    over the seeds, and the differences table pairs the two groups over their 3 seeds. Defect it catches: the
    per-run differences (9 rows of 1 seed each) or the old 'mean ± std'."""
    path = tmp_path / "seeds.duckdb"
    db = ResultsDB(path)
    sample_data.write_seed_runs(db, sample.root)
    for seed in (1, 2):  # local-only's other seeds
        sample_data.write_run(db, f"local-20260301-0099{seed:02d}-loc{seed:03d}", "local", "homo",
                              {**sample_data.params_for(sample.root), "seed": seed},
                              np.full(sample_data.K, sample_data.PER_CLIENT), sample_data.curve(0.64 + 0.01 * seed),
                              seed=20 + seed)
    at = app(FEDCACHE_RESULTS_DB=path)
    assert at.sidebar.toggle(key="group_seeds").value
    shown = _shown(at.dataframe[0]).set_index("group")
    assert re.fullmatch(INTERVAL + r" \(3 seeds\)", shown.at["fedcache/homo seed00 (3 seeds)", "maua"])
    rows = [line for line in _markdown(at, "**Paired differences**").splitlines() if line.startswith("| fedcache")]
    assert rows and all("| 3 |" in line for line in rows), rows
    assert "3 seeds (t interval over seeds" in _captions(at)


def test_the_pareto_view_shows_each_encoding_as_its_own_point_with_its_interval(app, sample, tmp_path):
    """write_encoded_runs' five runs (FedCache in float32, int8 and argmax; FedAvg in float32 and int8) opened by a
    link: the Pareto chart's data has one point per run, with the encoding its label's encode_* knobs name and its
    MAUA's 95% interval (an error bar), five distinct (method, encoding) points; the spec gives each encoding its
    shape, with a legend titled "encoding", and the tooltip names it. Defects it catches: encodings merged into
    their method's point, an encoding read from the wrong place (every run "float32"), points without intervals,
    a shape channel missing or without its legend."""
    from dashboard import pareto_chart

    path = tmp_path / "encoded.duckdb"
    ids = sample_data.write_encoded_runs(ResultsDB(path), sample.root)
    at = app(runs=list(ids.values()), FEDCACHE_RESULTS_DB=path)
    chart = next(c for c in at.get("vega_lite_chart") if "Pareto" in c.proto.spec)
    spec = json.loads(chart.proto.spec)
    frames = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets]
    points = next(f for f in frames if "encoding" in f and len(f) == len(ids))  # the points' dataset
    assert points["run_id"].is_unique and set(points["run_id"]) == set(ids.values())
    by_id = points.set_index("run_id")
    expected = {"fedcache": ("fedcache", "float32"), "fedcache_int8": ("fedcache", "int8"),
                "fedcache_argmax": ("fedcache", "argmax"), "fedavg": ("fedavg", "float32"),
                "fedavg_int8": ("fedavg", "int8")}
    for name, (algorithm, encoding) in expected.items():
        row = by_id.loc[ids[name]]
        assert (row["algorithm"], row["encoding"]) == (algorithm, encoding), name
        assert row["maua_low"] < row["maua"] < row["maua_high"], name  # its 95% interval, around the estimate
    assert len(set(zip(points["algorithm"], points["encoding"]))) == 5
    # a point is labelled by its method and encoding, not by a run name too long to sit beside it
    assert set(points["label"].str.removesuffix(" (tied)")) == {f"{a} {e}" for a, e in expected.values()}
    assert all(layer["mark"].get("limit") for layer in spec["layer"] if layer["mark"]["type"] == "text")
    assert by_id.at[ids["fedcache_argmax"], "bytes"] < by_id.at[ids["fedcache_int8"], "bytes"] \
        < by_id.at[ids["fedcache"], "bytes"] and by_id.at[ids["fedavg_int8"], "bytes"] < by_id.at[ids["fedavg"], "bytes"]
    # the spec: the points' layer shapes them by encoding, with its legend; the error bars stay
    shaped = [layer for layer in spec["layer"] if "shape" in layer.get("encoding", {})]
    assert len(shaped) == 1 and shaped[0]["mark"]["type"] == "point"
    shape = shaped[0]["encoding"]["shape"]
    assert shape["field"] == "encoding" and shape["legend"]["title"] == "encoding"
    assert shape["scale"]["domain"] == ["float32", "int8", "argmax"]
    assert shape["scale"]["range"] == [pareto_chart.encoding_shape(e) for e in ("float32", "int8", "argmax")]
    assert len(set(shape["scale"]["range"])) == 3
    assert any(t.get("field") == "encoding" for t in shaped[0]["encoding"]["tooltip"])
    bars = [layer for layer in spec["layer"] if layer["mark"]["type"] == "rule" and "y2" in layer["encoding"]]
    assert [b["encoding"]["y2"]["field"] for b in bars] == ["maua_high"]
    # the lists beside it: the run names say the encoding already (their encode_* knobs), nothing added to them;
    # int8 tied with float32 (the frontier's band), argmax alone on the frontier
    band = _markdown(at, "**Tied (the frontier's band)**")
    assert "- fedcache (consistency=round, encode_up=int8, encode_down=int8)/homo enc001: " in band
    assert "- fedcache (consistency=round)/homo enc000: " in band
    assert "- fedcache (consistency=round, encode_up=argmax, encode_down=argmax)/homo enc002: " in \
        _markdown(at, "**On the frontier**")
    assert "Shapes: each run's payload encoding" in _captions(at)


def test_a_run_named_by_its_id_keeps_its_encoding_in_the_pareto_list():
    """pareto_points reads the encoding from the stored labels (run_id -> what ran) when given, else from the run's
    name; the frontier list names it when the name does not (a run shown by its id)."""
    table = pd.DataFrame({"run": ["fedcache-x-1", "fedcache (encode_up=int8)/homo b2", "fedavg/homo c3"],
                          "run_id": ["fedcache-x-1", "b2", "c3"], "algorithm": ["fedcache", "fedcache", "fedavg"],
                          "setting": ["homo"] * 3, "maua": [0.8, 0.79, 0.7], "bytes_total": [1e5, 2e5, 3e5]})
    pts = data.pareto_points(table).set_index("run_id")
    assert pts["encoding"].to_dict() == {"fedcache-x-1": "float32", "b2": "int8", "c3": "float32"}
    labels = {"fedcache-x-1": "fedcache (encode_up=int8, encode_down=float16)"}
    pts = data.pareto_points(table, labels=labels)
    assert pts.set_index("run_id")["encoding"].to_dict() == {"fedcache-x-1": "up int8, down float16", "b2": "int8",
                                                              "c3": "float32"}
    items = {r.run_id: views.pareto_item(r) for r in pts.itertuples()}
    assert items["fedcache-x-1"].startswith("- fedcache-x-1 (up int8, down float16): 80.00%, ")
    assert items["b2"].startswith("- fedcache (encode_up=int8)/homo b2: ")  # its name says int8: not twice
    assert items["c3"].startswith("- fedavg/homo c3: ")  # float32: as before encodings
