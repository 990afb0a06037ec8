"""The Streamlit app through streamlit.testing's AppTest, one test per view, against a small
results DB, partition and knowledge cache built by dashboard.sample_data in a tmp dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from dashboard import sample_data
from dashboard.app import TABS
from pipeline.results import ResultsDB

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return sample_data.build_once(tmp_path_factory.getbasetemp() / "dashboard_sample")  # shared, read-only


@pytest.fixture
def app(sample, monkeypatch, repo_root):
    """app(**env) -> a run AppTest pointed at the sample inputs (env overrides on top)."""
    monkeypatch.chdir(repo_root)

    def _make(run: bool = True, **env: str) -> AppTest:
        for k, v in {**sample.env(), "FEDCACHE_DASHBOARD_REFRESH": "0", **env}.items():
            monkeypatch.setenv(k, str(v))
        at = AppTest.from_file(APP, default_timeout=60)
        return at.run() if run else at

    return _make


def charts(at: AppTest) -> dict[str, dict]:
    """Vega-Lite specs by title, each with its data frames under '_frames'."""
    out = {}
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        title = spec.get("title") or spec.get("mark", {})
        title = title.get("text", json.dumps(title)) if isinstance(title, dict) else str(title)
        spec["_frames"] = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in el.proto.datasets]
        if el.proto.data.data:
            spec["_frames"].append(convert_arrow_bytes_to_pandas_df(el.proto.data.data))
        out[title] = spec
    return out


def frame(spec: dict) -> pd.DataFrame:
    return pd.concat(spec["_frames"], ignore_index=True)


def texts(at: AppTest, *kinds: str) -> str:
    return "\n".join(str(e.value) for k in kinds for e in getattr(at, k))


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


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
    assert reached > fed["bytes_setup"] and fed["speedup"] == pytest.approx(1.0)

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


def test_clients_view(app):
    at = app()
    ch = charts(at)
    spread = ch["Per-client accuracy at each run's best round"]
    assert spread["mark"]["type"] == "boxplot"
    assert len(frame(spread)) == 3 * sample_data.K  # every client of every run at its best round
    at.selectbox(key="client").set_value(3).run()
    assert_clean(at)
    drill = charts(at)["Client 3: accuracy vs round"]
    assert set(frame(drill)["round"]) == set(range(sample_data.ROUNDS + 1))


def test_communication_view(app, sample):
    at = app()
    totals = frame(charts(at)["Bytes by kind and direction"])
    assert {"up · hashes", "up · logits", "down · knowledge"} <= set(totals["traffic"])
    per_round = [t for t in charts(at) if t.endswith("bytes per round")]
    assert per_round
    at.sidebar.toggle(key="include_setup").set_value(False).run()
    assert "up · hashes" not in set(frame(charts(at)["Bytes by kind and direction"])["traffic"])
    assert "local/homo bbbbbb" in texts(at, "caption")  # listed as sending nothing


def test_partition_view(app, sample):
    at = app()
    heat = frame(charts(at)["Training label mix per client"])
    assert len(heat) == sample_data.K * 10 and heat["client_id"].nunique() == sample_data.K
    assert "6 clients, 240 training" in texts(at, "caption")


def test_neighbours_view(app):
    at = app()
    assert len(at.get("image")) == 4
    captions = [i.proto.imgs[0].caption for i in at.get("image")]
    assert all(f"{sample_data.R} nearest cached neighbours" in c for c in captions)
    at.slider(key="nb_n").set_value(2).run()
    at.selectbox(key="nb_label").set_value(7).run()
    assert_clean(at)
    assert [i.proto.imgs[0].caption.split(" · ")[1] for i in at.get("image")] == ["7", "7"]


def test_params_view(app, sample):
    at = app()
    ids = sample.run_ids
    at.selectbox(key="params_a").set_value(ids["fedcache"]).run()
    at.selectbox(key="params_b").set_value(ids["fedcache_hetero"]).run()
    diff = [d.value for d in at.dataframe if "key" in d.value.columns][0].set_index("key")
    assert {"train.lr", "train.hetero", "run.setting"} <= set(diff.index)
    assert "seed" not in diff.index
    assert len(at.json) == 2
    at.selectbox(key="params_b").set_value(ids["local"]).run()
    diff = [d.value for d in at.dataframe if "key" in d.value.columns][0]
    assert diff["key"].tolist() == ["run.algorithm"]  # same params.yaml, different method


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
    assert_clean(at)
    assert "dvc repro partition" in texts(at, "info")


def test_damaged_index_names_the_file_and_the_fix(app, tmp_path):
    path = tmp_path / "results.duckdb"
    path.write_bytes(bytes(range(256)) * 64)  # random bytes, not a DuckDB file
    at = app(FEDCACHE_RESULTS_DB=path)
    assert not at.exception, [e.value for e in at.exception]  # no traceback
    [error] = [e.value for e in at.error]
    assert f"`{path}` is damaged" in error and f"python -m pipeline.results rebuild --index {path}" in error


def test_run_with_no_rounds(app, sample, tmp_path):
    path = tmp_path / "one.duckdb"
    db = ResultsDB(path)
    db.start_run("fedcache-x-000001", "fedcache", "mnist", "homo", sample_data.params_for(sample.root), "abc")
    at = app(FEDCACHE_RESULTS_DB=path)
    assert_clean(at)
    info = texts(at, "info")
    assert "has no rounds yet" in info and "no rounds yet" in info.lower()
    assert not at.dataframe or all("maua" not in d.value.columns for d in at.dataframe)


# Child processes run small scripts (duckdb + pipeline.results only: they start in ~0.2 s).
HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])  # a writer: exclusive lock on the file
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""

APPEND = """
import json, sys, time
from pipeline.results import RunResultsDB
path, run_id, last, hold_s, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
db = RunResultsDB(path, lock_timeout_s=60)  # a training stage: its own results file, the run started there
db.start_run(run_id, "fedcache", "mnist", "homo", json.loads(sys.argv[6]), "abc1234")
for rnd in range(last + 1):  # a training stage's write pattern: per round open, write, close
    acc = 0.1 + 0.05 * rnd
    up, down = (clients * 1000, 0) if rnd == 0 else (clients * 480, clients * 400)
    db.write_round(run_id, rnd, acc, up, down, 0.1, [(k, acc, 20) for k in range(clients)],
                   [(rnd, k, "up", "hashes" if rnd == 0 else "logits", up // clients, -1) for k in range(clients)])
    with db.connect() as con:  # a slow commit: keep the file locked for a moment
        time.sleep(hold_s)
db.finish_run(run_id)
print("done", flush=True)
"""


def child(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=Path(__file__).resolve().parent.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_locked_db_keeps_last_snapshot(app, sample, tmp_path):
    path = tmp_path / "r.duckdb"
    shutil.copy(sample.results_db, path)
    at = app(FEDCACHE_RESULTS_DB=path, FEDCACHE_DB_LOCK_TIMEOUT="0.2")
    assert len(at.dataframe[0].value) == 3
    holder = child(HOLD, path, 2.0)
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        at.run()  # the writer holds the file for longer than the retry window
        assert_clean(at)
        assert "locked by a writer" in texts(at, "warning")
        assert len(at.dataframe[0].value) == 3  # the previous snapshot stays on screen
    finally:
        holder.wait(10)
    at.run()
    assert_clean(at)
    assert "locked" not in texts(at, "warning")


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

    last = 12
    params = json.dumps(sample_data.params_for(sample.root, beta=2.0))
    writer = child(APPEND, tmp_path / "runs" / "fedcache" / "run.duckdb", run_id, last, 0.15, sample_data.K, params)
    seen, deadline = [], time.monotonic() + 45
    while writer.poll() is None and time.monotonic() < deadline:
        at.run()
        assert_clean(at)
        caption = texts(at, "caption")
        seen.append(int(caption.split("round ")[1].split()[0].rstrip(",")) if "round " in caption else -1)
    out, err = writer.communicate(timeout=30)
    assert writer.returncode == 0 and out.strip() == "done", err
    at.run()
    assert_clean(at)
    table = at.dataframe[0].value.set_index("run_id")
    assert table.at[run_id, "rounds"] == last and table.at[run_id, "status"] == "finished"
    assert seen == sorted(seen) and len(set(seen)) >= 2, seen  # rounds appeared while the writer ran
