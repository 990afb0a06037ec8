"""Dashboard data access (pure functions): results DB reads, derived frames, stage inputs, params diff."""

from __future__ import annotations

import io
import re
import os
import shutil
import subprocess
import sys
import time

import duckdb
import numpy as np
import pandas as pd
import pytest

from dashboard import ablation_charts, charts, data, sample_data, sample_privacy, stages
from dashboard.config import load_config
from pipeline.experiments.dvc import flatten
from pipeline.results.intervals import run_interval
from pipeline.results.store import ResultsDB


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return sample_data.build_once(tmp_path_factory.getbasetemp() / "dashboard_sample")  # shared, read-only


def test_config_cli_over_env_over_defaults():
    cfg = load_config([], {})
    assert str(cfg.results_db) == "results/results.duckdb" and str(cfg.stats_path) == "data/partition/stats.json"
    assert cfg.cache_db is None and cfg.refresh_s == 5.0
    env = {"FEDCACHE_RESULTS_DB": "/e/r.duckdb", "FEDCACHE_DASHBOARD_REFRESH": "0", "FEDCACHE_CACHE_DB": "/e/c.db"}
    cfg = load_config(["-q", "-p", "no:cacheprovider", "--results-db", "/cli/r.duckdb"], env)  # pytest's argv passes
    assert str(cfg.results_db) == "/cli/r.duckdb" and cfg.refresh_s == 0.0 and str(cfg.cache_db) == "/e/c.db"


def test_missing_and_empty_db(tmp_path):
    with pytest.raises(data.NoResults, match="make run"):
        data.load_runs(tmp_path / "nope.duckdb")
    duckdb.connect(str(tmp_path / "empty.duckdb")).close()  # a file with no tables yet
    assert data.load_runs(tmp_path / "empty.duckdb").empty
    snap = data.load_snapshot(tmp_path / "empty.duckdb", ["x"])
    assert snap.rounds.empty and data.series(snap, ["x"]) == []


def test_runs_and_default_selection(sample):
    runs = data.load_runs(sample.results_db)
    assert len(runs) == 4 and set(runs["setting"]) == {"homo", "hetero"}
    assert runs.set_index("run_id").at[sample.run_ids["starting"], "n_rounds"] == 0
    assert isinstance(runs["params"].iloc[0], dict)
    # latest run with rounds per (algorithm, setting): the just-started run has none yet
    assert set(data.default_selection(runs)) == {sample.run_ids[k] for k in ("fedcache", "local", "fedcache_hetero")}


def test_snapshot_views(sample):
    ids = [sample.run_ids[k] for k in ("fedcache", "local", "starting")]
    snap = data.load_snapshot(sample.results_db, ids)
    assert list(dict.fromkeys(snap.rounds["run_id"])) == ids[:2]  # caller's order, empty run absent
    table = data.comparison_frame(snap, ids, target=0.6)
    assert table["algorithm"].tolist() == ["fedcache", "local"]
    fed = table.iloc[0]
    assert fed["maua"] == pytest.approx(max(sample_data.curve(0.8123)))  # the sample curve's best
    assert snap.clients.query("round == 0 and run_id == @ids[0]")["client_id"].tolist() == list(range(sample_data.K))
    assert fed["bytes_setup"] > 0 and fed["bytes_total"] == fed["bytes_setup"] + fed["bytes_training"]
    assert table.iloc[1]["bytes_total"] == 0
    csv = pd.read_csv(io.StringIO(data.csv_table(table)), keep_default_na=False).set_index("algorithm")
    assert csv.at["local", "speedup"] == "" and csv.at["local", "speedup_note"] == "no bytes sent"
    styler = data.sortable_table(table)
    styler._compute()
    cols = list(styler.data.columns)
    marked = {(r, cols[c]) for (r, c), props in styler.ctx.items() if ("font-weight", "bold") in props}
    best_maua = int(table["maua"].astype(float).idxmax())
    assert marked == {(best_maua, "maua"), (0, "bytes_total")}  # local sends nothing: FedCache has the fewest bytes
    missed = pd.read_csv(io.StringIO(data.csv_table(data.comparison_frame(snap, ids, target=0.99))),
                         keep_default_na=False).set_index("algorithm")
    assert missed.at["fedcache", "speedup_note"] == "not reached"
    curves = data.accuracy_curves(snap, include_setup=False)
    fc = curves[curves["run_id"] == ids[0]]
    assert fc["cum_bytes"].iloc[0] == 0 and fc["cum_bytes"].is_monotonic_increasing
    assert fc["cum_s"].tolist() == pytest.approx([0.5 * (r + 1) for r in range(sample_data.ROUNDS + 1)])  # sum of wall_s
    best = data.best_round_clients(snap)
    assert best.groupby("run_id")["client_id"].count().tolist() == [sample_data.K] * 2
    by_family = data.bytes_by_family(snap)
    assert set(by_family["flow"]) == {"set-up up", "knowledge up", "knowledge down"}
    assert set(data.bytes_by_family(snap, include_setup=False)["family"]) == {"knowledge"}
    assert data.client_history(snap, 0)["round"].max() == sample_data.ROUNDS
    assert not data.client_bytes(snap, 0).empty
    assert data.default_target(data.series(snap, ids)) == pytest.approx(0.64)
    assert data.default_target(data.series(snap, ids), snap) == pytest.approx(0.64)  # no report section
    first = snap.runs.index[snap.runs["run_id"] == ids[0]][0]
    snap.runs.at[first, "params"] = {**snap.runs.at[first, "params"], "report": {"target_acc": {"mnist": 0.6}}}
    assert data.default_target(data.series(snap, ids), snap) == pytest.approx(0.6)  # the report's, reached by all
    snap.runs.at[first, "params"] = {**snap.runs.at[first, "params"], "report": {"target_acc": {"mnist": 0.7}}}
    assert data.default_target(data.series(snap, ids), snap) == pytest.approx(0.64)  # not by all: the lowest MAUA
    for chart in (charts.accuracy_vs_round(curves), charts.accuracy_vs_round(curves, x="time"),
                  charts.client_spread(best), charts.bytes_by_family(by_family),
                  charts.bytes_per_round(data.bytes_per_round(snap)),
                  charts.accuracy_vs_bytes(curves, table[["run", "maua"]].iloc[1:])):
        assert chart.to_dict()  # valid Vega-Lite



def test_cache_stats_of_the_selected_fedcache_runs(sample, tmp_path):
    """The Cache tab's frame: per FedCache run and round, the four knowledge-cache metrics beside the run's
    mean accuracy (NaN where a round has none), in the selection's order; other runs have no rows."""
    ids = [sample.run_ids[k] for k in ("fedcache_hetero", "local", "fedcache")]
    snap = data.load_snapshot(sample.results_db, ids)
    stats = data.cache_stats(snap)
    assert list(stats.columns) == ["run", "algorithm", "run_id", "round", *data.CACHE_METRICS, "mean_acc"]
    assert list(dict.fromkeys(stats["run_id"])) == [ids[0], ids[2]]  # FedCache only, the caller's order
    assert snap.cache_runs == [sample.run_ids["fedcache"], sample.run_ids["fedcache_hetero"]]  # oldest first
    fc = stats[stats["run_id"] == sample.run_ids["fedcache"]]
    accs = sample_data.curve(0.8123)
    assert fc["round"].tolist() == list(range(sample_data.ROUNDS + 1))
    assert fc["mean_acc"].tolist() == pytest.approx(accs)
    for name in data.CACHE_METRICS:
        expected = [sample_data.cache_metrics(r, a).get(name, np.nan) for r, a in enumerate(accs)]
        np.testing.assert_array_equal(fc[name].to_numpy(), np.array(expected, dtype=float), err_msg=name)
    assert fc["run"].iloc[0] == "fedcache/homo aaaaaa" and set(stats["algorithm"]) == {"fedcache"}
    for metric in ("cache_coverage", "cache_staleness", "cache_teacher_entropy"):
        assert charts.cache_metric(stats, metric).to_dict()  # valid Vega-Lite
    assert charts.teacher_vs_students(stats).to_dict()

    # no selected run recorded it: an empty frame, and the runs that have it are still known
    snap = data.load_snapshot(sample.results_db, [sample.run_ids["local"]])
    assert data.cache_stats(snap).empty and len(snap.cache_runs) == 2
    # a results file without any (FedCache runs from before the metrics, local runs): none known
    db = ResultsDB(tmp_path / "old.duckdb")
    sample_data.write_run(db, "fedcache-old", "fedcache", "homo", sample_data.params_for(sample.root),
                          np.full(sample_data.K, sample_data.PER_CLIENT), sample_data.curve(0.8))
    with db.connect() as con:
        con.execute("DELETE FROM round_metrics")
    snap = data.load_snapshot(db.path, ["fedcache-old"])
    assert data.cache_stats(snap).empty and snap.cache_runs == [] and not snap.rounds.empty


HOLD = """
import sys, duckdb
con = duckdb.connect(sys.argv[1])  # a writer: exclusive lock on the file
print("ready", flush=True)
sys.stdin.readline()  # held until the test says so: no timing involved
con.close()
"""


def hold(path) -> subprocess.Popen:
    """A process holding `path` with a writer's lock until release(holder)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "ready"
    return holder


def release(holder: subprocess.Popen) -> None:
    if holder.poll() is None:
        holder.stdin.write("release\n")
        holder.stdin.flush()
    assert holder.wait(60) == 0


def test_locked_db_retries_then_reports_busy(sample, tmp_path, monkeypatch):
    import types

    import pipeline.results.store

    path = tmp_path / "locked.duckdb"
    shutil.copy(sample.results_db, path)
    holder = hold(path)
    try:
        with pytest.raises(data.ResultsBusy, match="locked"):
            data.load_runs(path, timeout_s=0.2)
        waited = []

        def sleep(seconds: float) -> None:  # the reader met the lock and waits: the writer lets go now
            if not waited:
                release(holder)
            waited.append(seconds)
            time.sleep(seconds)

        monkeypatch.setattr(pipeline.results.store, "time", types.SimpleNamespace(**{**vars(time), "sleep": sleep}))
        assert len(data.load_runs(path, timeout_s=120)) == 4  # waits for the writer to let go
        assert waited  # it did meet the lock
    finally:
        release(holder)


def test_reads_from_several_threads_at_once_each_get_the_data_and_leave_the_files_free(sample, tmp_path):
    """The reads share the process's DuckDB host (pipeline.results.store.host_cursor) and take turns: sessions reading
    at once (Streamlit runs each in a thread) all get every run, and after them the index can be opened for writing
    by another process (nothing stays attached)."""
    from concurrent.futures import ThreadPoolExecutor

    db = tmp_path / "results.duckdb"
    shutil.copy(sample.results_db, db)
    ids = list(sample.run_ids.values())
    with ThreadPoolExecutor(4) as pool:
        snaps = list(pool.map(lambda _: data.load_snapshot(db, ids), range(8)))
    assert all(len(s.runs) == 4 and s.rounds.equals(snaps[0].rounds) for s in snaps) and len(snaps[0].rounds) > 0
    release(hold(db))  # a writer's lock, taken at once


def test_stage_inputs(sample):
    stats = stages.load_stats(sample.partition_dir / "stats.json")
    mix = stages.label_mix(stats, "mnist")
    assert len(mix) == sample_data.K * 10 and mix["count"].sum() == stats["num_train"]
    assert np.allclose(mix.groupby("client_id")["share"].sum(), 1.0)
    assert stages.class_names("fashion_mnist", 10)[0] == "T-shirt/top"
    with pytest.raises(stages.InputMissing, match="dvc repro partition"):
        stages.load_stats(sample.root / "missing.json")

    params = sample_data.params_for(sample.root)
    assert stages.cache_db_path(params) == sample.cache_db
    assert str(stages.cache_db_path({})) == "data/cache/cache.db"
    ov = stages.cache_overview(sample.cache_db)
    assert ov["num_samples"] == stats["num_train"] and ov["meta"]["R"] == str(sample_data.R)
    ids = stages.pick_samples(sample.cache_db, 4, seed=1)
    assert len(ids) == 4 and ids == stages.pick_samples(sample.cache_db, 4, seed=1)
    nb = stages.neighbours(sample.cache_db, ids)
    assert len(nb) == 4 * (1 + sample_data.R)
    for sid, rows in nb.groupby("sample_id"):
        assert rows["rank"].tolist() == [-1, *range(sample_data.R)]
        assert (rows["label"] == rows["label"].iloc[0]).all()  # neighbours share the label
        assert sid not in rows["member_id"].iloc[1:].tolist()  # never the sample itself
    strip = stages.montage(np.zeros((6, 28, 28), np.uint8), [(0, 0, 0)] * 6, scale=2)
    assert strip.dtype == np.uint8 and strip.shape[0] == 60 and strip.shape[2] == 3
    with pytest.raises(stages.InputMissing, match="dvc repro index"):
        stages.cache_overview(sample.root / "nope.db")


def test_params_diff_of_n_runs_keeps_only_what_differs():
    a = {"train": {"lr": 0.01, "rounds": 30, "algorithms": ["fedcache"]}, "seed": 0}
    b = {"train": {"lr": 0.02, "rounds": 30, "algorithms": ["fedcache", "local"]}, "extra": {"x": 1}, "seed": 0}
    c = {"train": {"lr": 0.01, "rounds": 30, "algorithms": ["fedcache"]}, "seed": 1}
    flat = {name: flatten(p) for name, p in {"a": a, "b": b, "c": c}.items()}
    diff = data.params_diff(flat).set_index("key")
    assert list(diff.columns) == ["a", "b", "c"]
    assert list(diff.index) == ["extra.x", "seed", "train.algorithms", "train.lr"]  # train.rounds agrees: no row
    assert diff.at["train.lr", "b"] == "0.02" and diff.at["extra.x", "a"] == data.MISSING
    assert diff.at["train.algorithms", "b"] == '["fedcache", "local"]'
    assert data.params_diff({"a": flat["a"], "c": flat["c"]}).set_index("key").index.tolist() == ["seed"]
    assert data.params_diff({"a": flat["a"], "again": flat["a"]}).empty


def test_varying_params_filter_runs_by_any_key():
    runs = pd.DataFrame({
        "run_id": ["r1", "r2", "r3"], "algorithm": ["fedcache", "fedcache", "local"], "setting": ["homo"] * 3,
        "dataset": ["mnist"] * 3, "git_rev": ["abc"] * 3,
        "params": [{"index": {"R": 4}, "seed": 0}, {"index": {"R": 16}, "seed": 0}, {"index": {"R": 16}, "seed": 0}]})
    varying = data.varying_params(runs)
    assert varying == {"index.R": ["16", "4"], "run.algorithm": ['"fedcache"', '"local"']}  # seed, git_rev agree
    assert data.with_param(runs, "index.R", ["16"])["run_id"].tolist() == ["r2", "r3"]
    assert data.with_param(runs, "run.algorithm", ['"fedcache"'])["run_id"].tolist() == ["r1", "r2"]
    assert data.with_param(runs, "index.R", []).empty


def test_pareto_frontier_is_the_runs_no_other_beats_on_both():
    table = pd.DataFrame({
        "run": ["cheap", "best", "dominated", "tie_bytes_worse", "free", "no_rounds"],
        "algorithm": ["fedcache", "fedavg", "fd", "fedproto", "local", "pdfl"], "setting": ["homo"] * 6,
        "maua": [0.60, 0.70, 0.55, 0.58, 0.50, None],
        "bytes_total": [1e6, 1e8, 1e7, 1e6, 0, 0], "bytes_training": [5e5, 1e8, 1e7, 1e6, 0, 0]})
    pts = data.pareto_points(table).set_index("run")
    assert "no_rounds" not in pts.index  # no MAUA: nothing to place
    assert pts["frontier"].to_dict() == {"free": True, "cheap": True, "tie_bytes_worse": False, "dominated": False,
                                         "best": True}
    assert pts.index.tolist() == ["free", "cheap", "tie_bytes_worse", "dominated", "best"]  # by bytes, then MAUA
    # set-up left out: 'cheap' sends half, 'tie_bytes_worse' still as much and less accurate
    assert data.pareto_points(table, include_setup=False).set_index("run").at["cheap", "bytes"] == 5e5
    same = table.assign(maua=[0.6] * 5 + [None], bytes_total=[1e6] * 6)  # equal on both: nobody beats anybody
    assert data.pareto_points(same)["frontier"].all()


# ----------------------------------------------------------------------------- index + per-run files

def _age(path, seconds: float = 10.0) -> None:
    """Date a file back (so the index built after it is unambiguously newer)."""
    t = path.stat().st_mtime_ns - int(seconds * 1e9)
    os.utime(path, ns=(t, t))


def test_index_plus_live_per_run_files(sample, tmp_path):
    from pipeline.results.store import RunResultsDB, rebuild_index

    sizes = np.full(sample_data.K, sample_data.PER_CLIENT)
    params = sample_data.params_for(sample.root)
    fed = RunResultsDB(tmp_path / "runs" / "fedcache" / "run.duckdb")
    local = RunResultsDB(tmp_path / "runs" / "local" / "run.duckdb")
    accs = sample_data.curve(0.8)
    sample_data.write_run(fed, "fedcache-1", "fedcache", "homo", params, sizes, accs[:3], finish=False)  # running
    sample_data.write_run(local, "local-1", "local", "homo", params, sizes, sample_data.curve(0.6), seed=2)
    _age(fed.path)
    _age(local.path)
    index = tmp_path / "results.duckdb"
    rebuild_index(index)
    assert data.live_run_files(index, tmp_path / "runs") == []  # the index holds them as they are
    snap = data.load_snapshot(index, ["fedcache-1", "local-1"])
    assert snap.rounds.groupby("run_id")["round"].max().to_dict() == {"fedcache-1": 2, "local-1": sample_data.ROUNDS}

    # the running stage writes more rounds: its file is newer than the index and is read directly
    for rnd in range(3, sample_data.ROUNDS + 1):
        sample_data.write_round(fed, "fedcache-1", "fedcache", rnd, accs[rnd], sizes)
    fed.finish_run("fedcache-1")
    assert data.live_run_files(index, tmp_path / "runs") == [fed.path]
    snap = data.load_snapshot(index, ["fedcache-1", "local-1"])
    assert snap.rounds.groupby("run_id")["round"].agg(["max", "count"]).to_dict("index") == {
        "fedcache-1": {"max": sample_data.ROUNDS, "count": sample_data.ROUNDS + 1},  # no row twice
        "local-1": {"max": sample_data.ROUNDS, "count": sample_data.ROUNDS + 1}}
    assert snap.runs.set_index("run_id").at["fedcache-1", "status"] == "finished"  # the file's row, not the index's
    assert len(snap.clients[snap.clients["run_id"] == "fedcache-1"]) == (sample_data.ROUNDS + 1) * sample_data.K

    # a stage that started after the index was built shows up at once
    RunResultsDB(tmp_path / "runs" / "fd" / "run.duckdb").start_run("fd-1", "fd", "mnist", "homo", params, "abc")
    runs = data.load_runs(index).set_index("run_id")
    assert set(runs.index) == {"fedcache-1", "local-1", "fd-1"} and runs.at["fd-1", "n_rounds"] == 0

    # no index at all: the per-run files alone
    index.unlink()
    assert set(data.load_runs(index)["run_id"]) == {"fedcache-1", "local-1", "fd-1"}


def test_the_audits_figures_come_from_the_rebuilt_index(sample, tmp_path):
    """An audit.json beside the per-run files (flows/audit.py's run_id and figures) reaches the snapshot through the
    index's privacy table, for the selected runs only; an index from before that table, or none, has none to give."""
    import json

    from pipeline.results.store import RUN_SCHEMA, RunResultsDB, rebuild_index

    sizes = np.full(sample_data.K, sample_data.PER_CLIENT)
    params = sample_data.params_for(sample.root)
    for name, algorithm in (("fedcache", "fedcache"), ("local", "local"), ("fd", "fd")):
        db = RunResultsDB(tmp_path / "runs" / name / "run.duckdb")
        sample_data.write_run(db, f"{name}-1", algorithm, "homo", params, sizes, sample_data.curve(0.7))
        _age(db.path)
    for name in ("fedcache", "local"):  # fd: not audited
        figures = {m: dict(zip(("mean", "low", "high"), v)) for m, v in sample_privacy.PRIVACY[name].items()}
        audit = tmp_path / "audit" / name / "audit.json"
        audit.parent.mkdir(parents=True)
        audit.write_text(json.dumps({"run_id": f"{name}-1", "figures": figures}))
    index = tmp_path / "results.duckdb"
    rebuild_index(index)
    snap = data.load_snapshot(index, ["local-1", "fd-1"])
    assert snap.privacy_indexed and set(snap.privacy["run_id"]) == {"local-1"}  # fedcache-1 not selected
    read = {m: (mean, low, high) for m, mean, low, high in snap.privacy[["metric", "mean", "low", "high"]].itertuples(
        index=False)}
    assert read.keys() == sample_privacy.PRIVACY["local"].keys()
    assert all(read[m] == pytest.approx(v) for m, v in sample_privacy.PRIVACY["local"].items())
    assert data.audited(snap, ["fd-1", "local-1"]) == ["local-1"]
    snap = data.load_snapshot(index, ["fedcache-1", "local-1"])
    assert list(dict.fromkeys(snap.privacy["run_id"])) == ["fedcache-1", "local-1"]  # the caller's order
    table = data.privacy_table(snap, ["fedcache-1", "local-1"])
    assert table["MIA AUC (LiRA)"].tolist() == ["0.61 [0.56, 0.66]", "0.64 [0.58, 0.70]"]

    # no index (the per-run files alone), or one from before the privacy table: nothing to read, and the view says so
    index.unlink()
    snap = data.load_snapshot(index, ["fedcache-1"])
    assert not snap.privacy_indexed and snap.privacy.empty
    with duckdb.connect(str(index)) as con:
        con.execute(RUN_SCHEMA)
        con.execute("INSERT INTO runs (run_id, algorithm, dataset, setting, params, git_rev, status) "
                    "VALUES ('x-1', 'fedcache', 'mnist', 'homo', '{}', 'abc', 'finished')")
    snap = data.load_snapshot(index, ["x-1"])
    assert not snap.privacy_indexed and snap.privacy.empty and "x-1" in set(snap.runs["run_id"])


def test_damaged_files_are_named_with_the_command_that_rebuilds_them(sample, tmp_path):
    from pipeline.results.store import RunResultsDB, rebuild_index

    index = tmp_path / "results.duckdb"
    index.write_bytes(b"not a database" * 1000)
    with pytest.raises(data.ResultsDamaged) as err:
        data.load_runs(index)
    assert f"`{index}`" in str(err.value) and f"python -m pipeline.results.store rebuild --index {index}" in str(err.value)

    run = RunResultsDB(tmp_path / "runs" / "fd-hetero" / "run.duckdb")
    run.start_run("fd-1", "fd", "mnist", "hetero", {}, "abc")
    rebuild_index(index)
    run.path.write_bytes(b"not a database" * 1000)  # changed since the index: read directly, and damaged
    with pytest.raises(data.ResultsDamaged) as err:
        data.load_snapshot(index, ["fd-1"])
    assert f"`{run.path}`" in str(err.value) and "dvc repro -s -f train-hetero@fd" in str(err.value)


def test_a_damaged_block_is_damaged_not_locked(tmp_path):
    """DuckDB reports a bad block as "checksum ... in block at location ...": damaged, with the rebuild
    command, and at once (a busy file would be retried until the timeout)."""
    from pipeline.results.store import ResultsDB

    index = tmp_path / "results.duckdb"
    db = ResultsDB(index)
    db.start_run("fd-1", "fd", "mnist", "homo", {}, "abc")
    db.write_round("fd-1", 0, 0.5, 10, 10, 1.0, [(0, 0.5, 10)], [], {})
    raw = bytearray(index.read_bytes())
    header = 3 * 4096  # DuckDB's file header and its two database headers; then the blocks, the catalog's first
    raw[header:header + 4096] = bytes(b ^ 0xFF for b in raw[header:header + 4096])
    index.write_bytes(bytes(raw))
    start = time.monotonic()
    with pytest.raises(data.ResultsDamaged) as err:
        data.load_runs(index, timeout_s=30)
    assert time.monotonic() - start < 15, "retried as if a writer held the file"
    assert "block" in str(err.value) and "locked" not in str(err.value)
    assert f"python -m pipeline.results.store rebuild --index {index}" in str(err.value)


def test_locked_per_run_file_reports_busy(tmp_path):
    from pipeline.results.store import RunResultsDB

    run = RunResultsDB(tmp_path / "runs" / "fedcache" / "run.duckdb")
    run.start_run("fedcache-1", "fedcache", "mnist", "homo", {}, "abc")
    holder = hold(run.path)
    try:
        with pytest.raises(data.ResultsBusy, match="locked by a writer"):
            data.load_runs(tmp_path / "results.duckdb", timeout_s=0.2)
    finally:
        release(holder)
    assert data.load_runs(tmp_path / "results.duckdb")["run_id"].tolist() == ["fedcache-1"]


def test_runs_of_a_published_experiment_are_labelled_with_it(tmp_path):
    """A sweep's experiment publishes its runs to <index dir>/experiments/<name>/ (pipeline.experiments.dvc):
    the index holds them beside the workspace's runs, labelled with the experiment's name."""
    from pipeline.results.store import RunResultsDB, rebuild_index

    params = {"seed": 0}
    RunResultsDB(tmp_path / "runs" / "fd" / "run.duckdb").start_run("fd-1", "fd", "mnist", "homo", params, "abc")
    RunResultsDB(tmp_path / "experiments" / "sweep-R-4" / "fd" / "run.duckdb").start_run(
        "fd-2", "fd", "mnist", "homo", params, "abc", experiment="sweep-R-4", changed={"index.R": 4})
    index = tmp_path / "results.duckdb"
    assert rebuild_index(index).runs == 2
    runs = data.load_runs(index).set_index("run_id")
    assert runs.at["fd-2", "label"] == "fd/homo sweep-R-4" and runs.at["fd-2", "changed"] == {"index.R": 4}
    assert runs.at["fd-1", "label"] == "fd/homo fd-1" and pd.isna(runs.at["fd-1", "experiment"])


def test_legends_name_what_ran_by_the_stored_label(tmp_path):
    """Issue 22: the runs table's label (method plus non-default knobs) stands for the method in a legend
    name; a run without one (from before labels) keeps its algorithm; names stay unique."""
    from pipeline.results.store import RunResultsDB

    def start(name, run_id, algorithm, label):
        RunResultsDB(tmp_path / "runs" / name / "run.duckdb").start_run(run_id, algorithm, "mnist", "homo", {}, "abc",
                                                                        label=label)

    start("pdfl", "pdfl-x-d663c8", "pdfl", "pdfl (order=body_then_head)")
    start("fedcache", "fedcache-x-aaaaa1", "fedcache", "fedcache")
    start("fd", "fd-x-bbbbb1", "fd", None)  # as an old file reads: no label
    runs = data.load_runs(tmp_path / "results.duckdb").set_index("run_id")
    assert runs["label"].to_dict() == {"pdfl-x-d663c8": "pdfl (order=body_then_head)/homo d663c8",
                                       "fedcache-x-aaaaa1": "fedcache/homo aaaaa1", "fd-x-bbbbb1": "fd/homo bbbbb1"}
    # a frame without the column (an old database's reader) falls back to the algorithm; duplicates to the run id
    frame = pd.DataFrame({"algorithm": ["fd", "fd"], "setting": ["homo", "homo"], "run_id": ["a-123456", "b-123456"]})
    assert data.run_labels(frame) == ["a-123456", "b-123456"]
    frame["method_label"] = ["fd (gamma=0.5)", None]
    assert data.run_labels(frame) == ["fd (gamma=0.5)/homo 123456", "fd/homo 123456"]


def _colours(chart, channel: str = "color") -> dict:
    """value -> colour (or dash) of a chart's scale, from its Vega-Lite spec."""
    spec = chart.to_dict()
    enc = (spec.get("layer") or [spec])[0]["encoding"][channel]
    return dict(zip(enc["scale"]["domain"], enc["scale"]["range"]))


def test_colours_are_fixed_per_method(sample):
    """A method gets the same colour in every chart whatever is selected and in whatever order."""
    ids = sample.run_ids
    one = data.load_snapshot(sample.results_db, [ids["fedcache"], ids["local"]])
    other = data.load_snapshot(sample.results_db, [ids["local"], ids["fedcache_hetero"], ids["fedcache"]])
    for snap in (one, other):
        curves = data.accuracy_curves(snap)
        for chart in (charts.accuracy_vs_round(curves), charts.accuracy_vs_bytes(curves, curves.iloc[:0]),
                      charts.client_spread(data.best_round_clients(snap)),
                      charts.client_accuracy(data.client_history(snap, 0), 0)):
            assert _colours(chart)["fedcache/homo aaaaaa"] == charts.METHOD_COLORS["fedcache"]
            assert _colours(chart)["local/homo bbbbbb"] == charts.METHOD_COLORS["local"]
    both = charts.accuracy_vs_round(data.accuracy_curves(other))
    assert _colours(both)["fedcache/hetero cccccc"] == charts.METHOD_COLORS["fedcache"]
    dashes = _colours(both, "strokeDash")  # the second FedCache run: same colour, dashed
    assert dashes["local/homo bbbbbb"] == dashes["fedcache/hetero cccccc"] == [1, 0] != dashes["fedcache/homo aaaaaa"]
    # any other algorithm: a colour of its own, the same in every process (not Python's salted hash)
    assert charts.method_color("newalgo") == charts.method_color("newalgo") in charts.OTHER_COLORS
    script = "from dashboard.charts import method_color; print(method_color('newalgo'))"
    assert subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "1"}).stdout.strip() == charts.method_color("newalgo")
    # the Communication charts too: a run in its method's colour, whatever else is selected
    for snap in (one, other):
        runs = data.run_algorithms(snap, [r for r in snap.runs["run_id"] if r in set(snap.comm_rounds["run_id"])])
        for chart in (charts.bytes_by_family(data.bytes_by_family(snap), runs),
                      charts.bytes_per_round(data.bytes_per_round(snap), runs)):
            assert _colours(chart)["fedcache/homo aaaaaa"] == charts.METHOD_COLORS["fedcache"]


def test_traffic_by_family_and_per_round(sample):
    ids = sample.run_ids
    snap = data.load_snapshot(sample.results_db, [ids["fedcache"], ids["local"]])
    fam = data.bytes_by_family(snap)
    fed = fam[fam["run"] == "fedcache/homo aaaaaa"]
    assert fed["flow"].tolist() == ["set-up up", "knowledge up", "knowledge down"]  # reading order, up first
    assert fed.set_index("flow").at["knowledge up", "kinds"] == "logits"
    raw = snap.comm_rounds[snap.comm_rounds["run_id"] == ids["fedcache"]]
    assert fed["bytes"].sum() == raw["bytes"].sum()  # every byte in one family
    assert "set-up up" not in set(data.bytes_by_family(snap, include_setup=False)["flow"])
    per_round = data.bytes_per_round(snap).set_index(["run_id", "round"])
    one = raw[raw["round"] == 1]
    assert per_round.at[(ids["fedcache"], 1), "up"] == one.loc[one["direction"] == "up", "bytes"].sum()
    assert per_round.at[(ids["fedcache"], 1), "bytes"] == one["bytes"].sum()
    assert data.family("block2") == "parameters" and data.family("something_new") == "something_new"


@pytest.fixture
def mixed(sample, tmp_path):
    """(index path, ids) of sample_data.write_mixed_runs: one set-up's finished runs, a test run, a killed run."""
    from pipeline.results.store import ResultsDB

    path = tmp_path / "mixed.duckdb"
    return path, sample_data.write_mixed_runs(ResultsDB(path), sample.root)


def test_default_selection_is_the_latest_finished_run_of_the_common_setup(mixed):
    path, ids = mixed
    runs = data.load_runs(path)
    # not the newer 4-round test run, nor the newest run (killed, still 'running')
    assert data.default_selection(runs) == [ids["fedavg"], ids["fedcache"], ids["local"]]
    assert data.setup_mismatch(runs, [ids["fedcache"], ids["fedavg"], ids["local"]]) is None
    msg = data.setup_mismatch(runs, [ids["fedcache"], ids["test"]])
    assert "**train.rounds** 4 (fedcache/homo ddddd1); 6 (fedcache/homo aaaaa1)" in msg
    assert "dataset" not in msg and "num_clients" not in msg
    # no finished run at all: the latest run that has written a round
    assert data.default_selection(runs[runs["run_id"] == ids["killed"]]) == [ids["killed"]]


def test_the_page_knows_when_a_running_run_turns_stale():
    """The dashboard redraws only when a results file changes, and once more when a run shown 'running' turns
    'stale' (data.next_stale): the first moment, among the running runs not stale yet, their threshold passes."""
    now = pd.Timestamp("2026-01-01 12:00")
    frame = pd.DataFrame({"status": ["running", "running", "finished"], "started_at": [now - pd.Timedelta("30min")] * 3,
                          "wall_total": [60.0, 1500.0, 60.0], "wall_max": [10.0, 60.0, 10.0], "seen_s": [None] * 3})
    # the first is stale already (its last round 29 min ago); the second's last round 5 min ago: stale in 5 min
    assert data.next_stale(frame, now) == (now + pd.Timedelta("5min")).to_pydatetime().timestamp()
    assert data.shown_status(frame, now + pd.Timedelta("5min"))[1] == "running"
    assert data.shown_status(frame, now + pd.Timedelta("5min 1s"))[1] == "stale (no round for 10 min)"
    assert data.next_stale(frame, now + pd.Timedelta("6min")) is None  # none left to turn


def test_a_running_run_without_rounds_for_minutes_is_shown_as_stale(mixed, tmp_path):
    path, ids = mixed
    runs = data.load_runs(path).set_index("run_id")
    assert runs.at[ids["killed"], "status"] == "running"  # the stored status is kept
    assert runs.at[ids["killed"], "status_shown"] in ("stale (no round for 59 min)", "stale (no round for 60 min)")
    assert runs.at[ids["fedcache"], "status_shown"] == "finished"
    now = pd.Timestamp("2026-01-01 12:00")
    frame = pd.DataFrame({"status": ["running", "running", "running"], "started_at": [now - pd.Timedelta("30min")] * 3,
                          "wall_total": [60.0, 60.0, 1500.0], "wall_max": [10.0, 900.0, 60.0],
                          "seen_s": [None, None, None]})
    assert data.shown_status(frame, now) == ["stale (no round for 29 min)",
                                             "running",  # rounds take 15 min: not stale before 45 min
                                             "running"]  # the last round 5 min ago

    # a per-run file written to recently (a resumed run: started long ago, few rounds' wall_s) is running
    from pipeline.results.store import RunResultsDB
    run = RunResultsDB(tmp_path / "runs" / "fedcache" / "run.duckdb")
    sample_data.write_run(run, "fedcache-r", "fedcache", "homo", {}, np.full(sample_data.K, 5), [0.1, 0.2], finish=False)
    with run.connect() as con:
        con.execute("UPDATE runs SET started_at = started_at - INTERVAL 2 HOUR")
    assert data.load_runs(tmp_path / "results.duckdb").set_index("run_id").at["fedcache-r", "status_shown"] == "running"
    for f in (run.path, run.path.with_name(run.path.name + ".wal")):  # its last write 20 min ago
        if f.exists():
            _age(f, 20 * 60)
    assert data.load_runs(tmp_path / "results.duckdb").set_index("run_id").at[
        "fedcache-r", "status_shown"] == "stale (no round for 20 min)"


def test_comparison_baseline_and_display(mixed):
    path, ids = mixed
    picked = [ids["fedcache"], ids["fedavg"], ids["local"]]
    snap = data.load_snapshot(path, picked)
    assert data.default_baseline(["fedcache", "fedavg"]) == "fedavg" and data.default_baseline(["fd"]) == data.COSTLIEST
    by = {b: data.comparison_frame(snap, picked, 0.6, baseline=b).set_index("run_id")
          for b in ("fedavg", "fedcache", data.COSTLIEST)}
    assert set(by["fedavg"]["speedup_vs"]) == {"fedavg"} and set(by["fedcache"]["speedup_vs"]) == {"fedcache"}
    assert set(by[data.COSTLIEST]["speedup_vs"]) == {"fedavg"}  # the costliest run reaching 60 %
    assert by["fedcache"].at[ids["fedcache"], "speedup"] == pytest.approx(1.0)
    shown = data.display_table(by["fedavg"].reset_index()).set_index("run_id")
    assert shown.at[ids["fedavg"], "speedup"] == "1.00x" and shown.at[ids["fedavg"], "speedup_vs"] == "fedavg at 60.0%"
    assert shown.at[ids["local"], "speedup"] == "no bytes sent"
    missed = data.display_table(data.comparison_frame(snap, picked, 0.99, baseline=data.COSTLIEST))  # none reaches it
    assert (missed["bytes_to_target"] == "not reached").all() and (missed["speedup"] == "not reached").all()
    assert (missed["speedup_vs"] == "no run reaches the target").all()
    assert [data.fmt_bytes(n) for n in (0, 999, 1000, 12_345, 999_949, 999_950, 2.5e9, None)] == [
        "0 B", "999 B", "1.0 KB", "12.3 KB", "999.9 KB", "1.0 MB", "2.5 GB", "—"]


def test_seed_groups_join_runs_that_differ_only_in_seed():
    base = {"seed": 0, "train": {"rounds": 6, "seed": 5}, "fedcache": {"beta": 1.5}}
    runs = pd.DataFrame({
        "label": ["a", "b", "c", "d", "e", "f"],
        "algorithm": ["fedcache", "fedcache", "fedcache", "fedavg", "fedcache", "fedcache"],
        "setting": ["homo", "homo", "homo", "homo", "hetero", "homo"],
        "params": [base, {**base, "seed": 1}, {**base, "seed": 2},  # one group of 3 seeds
                   {**base, "seed": 1},  # another algorithm
                   {**base, "seed": 1},  # another setting
                   {**base, "seed": 3, "train": {"rounds": 6, "seed": 6}}],  # a nested seed is config
    }, index=[10, 11, 12, 13, 14, 15])
    groups = data.seed_groups(runs)
    assert groups.index.tolist() == runs.index.tolist()
    assert groups.tolist() == ["a (3 seeds)"] * 3 + ["d", "e", "f"]
    assert data.has_seed_groups(runs) and not data.has_seed_groups(runs.iloc[3:])
    repeat = runs.iloc[[0, 0]].assign(label=["a", "a2"])  # the same seed twice: repeats, not seeds
    assert data.seed_groups(repeat).tolist() == ["a (2 runs)"] * 2 and not data.has_seed_groups(repeat)
    assert data.seed_groups(runs.iloc[:0]).empty and not data.has_seed_groups(runs.iloc[:0])


def test_seed_group_curves_and_table(tmp_path):
    from pipeline.results.store import ResultsDB

    path = tmp_path / "seeds.duckdb"
    ids = sample_data.write_seed_runs(ResultsDB(path), tmp_path)
    picked = list(ids.values())
    fed = [ids[s] for s in (0, 1, 2)]
    assert data.default_selection(data.load_runs(path)) == [*fed, ids[-1]]  # every seed of the latest configuration
    snap = data.load_snapshot(path, picked)
    group = "fedcache/homo seed00 (3 seeds)"
    assert data.group_algorithms(snap, picked) == {group: "fedcache", "local/homo ffffff": "local"}
    curves = data.accuracy_curves(snap)
    grouped = data.group_curves(snap, curves, picked)
    last = grouped[(grouped["run"] == group) & (grouped["round"] == sample_data.ROUNDS)].iloc[0]
    finals = curves[curves["run_id"].isin(fed) & (curves["round"] == sample_data.ROUNDS)]["mean_acc"]
    assert last["n"] == 3 and last["mean_acc"] == pytest.approx(finals.mean())
    assert (last["acc_min"], last["acc_max"]) == pytest.approx((finals.min(), finals.max()))

    table = data.comparison_frame(snap, picked, 0.7, baseline="fedcache")
    groups = data.group_table(snap, table, picked).set_index("group")
    assert groups.at[group, "n"] == 3 and groups.at[group, "n_reached"] == 3
    assert groups.at[group, "maua_mean"] == pytest.approx(table.set_index("run_id").loc[fed, "maua"].mean())
    assert groups.at[group, "maua_std"] == pytest.approx(table.set_index("run_id").loc[fed, "maua"].std())
    # across seeds: the MAUA over the 3 seeds with a t interval over them (pipeline.results.intervals)
    mauas = table.set_index("run_id").loc[fed, "maua"]
    half = 4.302652729911275 * mauas.std() / 3 ** 0.5  # t(0.975, 2 degrees of freedom)
    assert (groups.at[group, "maua_low"], groups.at[group, "maua_high"]) == pytest.approx(
        (mauas.mean() - half, mauas.mean() + half))
    assert groups.at[group, "seeds"] == 3 and groups.at[group, "covers"].startswith("3 seeds (t interval")
    shown = data.display_group_table(groups.reset_index()).set_index("group")
    assert shown.at[group, "maua"] == f"{mauas.mean():.1%} [{(mauas.mean() - half) * 100:.1f}, " \
                                      f"{(mauas.mean() + half) * 100:.1f}] (3 seeds)"
    assert shown.at[group, "bytes_to_target"].endswith("(3 seeds)")
    assert shown.at["local/homo ffffff", "maua"].endswith("(1 seed)")
    assert shown.at["local/homo ffffff", "bytes_to_target"] == "not reached"
    band = charts.accuracy_band(grouped, data.group_algorithms(snap, picked)).to_dict()
    assert [layer["mark"]["type"] for layer in band["layer"]] == ["area", "line"]
    assert band["layer"][0]["encoding"]["color"]["scale"]["range"] == [charts.method_color("fedcache"),
                                                                     charts.method_color("local")]


def test_swept_key_is_read_from_the_experiment_name_and_params():
    params = {"seed": 0, "partition": {"alpha": 1.0, "data_fraction": 0.0033}, "index": {"R": 16},
              "fedcache": {"T": 3.0}, "fd": {"T": 3.0}}
    algos = {"train.algorithms": ["fedcache", "fd"]}
    assert data.swept_key("ablation_R-R-16", params, algos) == ("index.R", "ablation_R")  # params.yaml's R: not changed
    assert data.swept_key("ablation_data_share-data_fraction-0.0033", params,
                          {**algos, "partition.data_fraction": 0.0033}) == ("partition.data_fraction",
                                                                            "ablation_data_share")
    assert data.swept_key("a-b-alpha-1", params, None) == ("partition.alpha", "a-b")  # a sweep name with dashes
    assert data.swept_key("ablation_alpha-alpha-3", params, algos) is None  # the name's value is not the run's
    assert data.swept_key("sweep-T-3.0", params, algos) is None  # fedcache.T or fd.T: ambiguous
    assert data.swept_key("seeds-seed-1", {**params, "seed": 1}, {"seed": 1}) is None  # repetitions, not an ablation
    assert data.swept_key("dingy-bots", params, {"index.R": 4}) == ("index.R", "dingy-bots")  # dvc exp run -S
    assert data.swept_key("dingy-bots", params, {"index.R": 4, "partition.alpha": 3}) is None
    assert data.swept_key(None, params, {"index.R": 4}) is None  # not an experiment


def test_ablation_points_per_swept_value_and_method(tmp_path):
    from pipeline.results.store import ResultsDB

    path = tmp_path / "ablations.duckdb"
    ids = sample_data.write_ablation_runs(ResultsDB(path), tmp_path)
    snap = data.load_snapshot(path, [])  # the Ablations tab does not depend on the sidebar's selection
    swept = data.ablation_runs(snap.runs)
    assert ids[("seed", 1, "fedcache")] not in set(swept["run_id"])
    assert set(snap.ablation_rounds["run_id"]) == set(swept["run_id"]) == \
        set(ids.values()) - {ids[("seed", 1, "fedcache")]}
    points = data.ablation_points(snap)
    assert list(dict.fromkeys(points["ablation"])) == ["index.R", "partition.alpha"]
    alpha = points[points["ablation"] == "partition.alpha"]
    assert alpha[["value", "algorithm"]].values.tolist() == [[v, a] for a in ("fd", "fedcache")
                                                             for v in (1.0, 3.0, 10.0)]
    series = {s.run_id: s for s in ResultsDB(path).series(list(ids.values()))}
    for row in alpha.itertuples():
        runs = [ids[("partition.alpha", row.value, row.algorithm)]]
        if (row.value, row.algorithm) == (3.0, "fedcache"):
            runs.append(ids[("partition.alpha", 3.0, "fedcache", 1)])  # seed 1: the mean of both
        assert row.seeds == len(runs)
        assert row.maua == pytest.approx(sum(series[r].maua for r in runs) / len(runs))
        assert row.bytes == pytest.approx(sum(series[r].total_bytes for r in runs) / len(runs))
        # the interval over those seeds' clients, as the comparison table computes it (a point without its
        # clients' rows, or with another run's, would get other bounds)
        expected = run_interval([series[r].accuracies() for r in runs], "maua")
        assert (row.maua_low, row.maua_high) == pytest.approx((expected.low, expected.high))
        assert row.covers.startswith(f"{len(runs)} seed")
    fed = alpha[alpha["algorithm"] == "fedcache"]
    assert fed["maua"].is_monotonic_increasing
    assert (fed["bytes"] > alpha[alpha["algorithm"] == "fd"]["bytes"].max()).all()
    r_values = points.loc[points["ablation"] == "index.R", "value"].tolist()
    assert r_values == [1, sample_data.R, 16] * 2 and all(type(v) is int for v in r_values)  # as params has them
    no_setup = data.ablation_points(snap, include_setup=False).set_index(["ablation", "value", "algorithm"])
    assert (no_setup.loc[("partition.alpha", 1.0, "fedcache"), "bytes"]
            == series[ids[("partition.alpha", 1.0, "fedcache")]].total_bytes
            - series[ids[("partition.alpha", 1.0, "fedcache")]].setup_bytes)
    # the charts: the method's colour, a log x axis over a decade or more
    spec = ablation_charts.ablation_maua(alpha, "partition.alpha").to_dict()["layer"][0]
    assert spec["encoding"]["x"]["scale"]["type"] == "log" and spec["encoding"]["x"]["axis"]["values"] == [1, 3, 10]
    assert dict(zip(spec["encoding"]["color"]["scale"]["domain"], spec["encoding"]["color"]["scale"]["range"])) == {
        "fd": charts.method_color("fd"), "fedcache": charts.method_color("fedcache")}
    narrow = alpha.assign(value=alpha["value"].map({1.0: 1.0, 3.0: 2.0, 10.0: 4.0}))  # under a decade: linear
    assert ablation_charts.ablation_maua(narrow, "x").to_dict()["layer"][0]["encoding"]["x"]["scale"]["type"] == "linear"
    named = alpha.assign(value=alpha["value"].map({1.0: "hog", 3.0: "simhash", 10.0: "pixels"}))
    assert ablation_charts.ablation_bytes(named, "encode.encoder").to_dict()["encoding"]["x"]["type"] == "nominal"


def test_default_selection_prefers_workspace_runs_to_sweep_runs(tmp_path):
    from pipeline.results.store import ResultsDB

    path = tmp_path / "both.duckdb"
    mixed = sample_data.write_mixed_runs(ResultsDB(path), tmp_path)
    sample_data.write_ablation_runs(ResultsDB(path), tmp_path)  # newer, same set-up, FedCache and FD
    runs = data.load_runs(path)
    assert data.default_selection(runs) == [mixed["fedavg"], mixed["fedcache"], mixed["local"]]
    sweeps_only = runs[runs["experiment"].notna()]
    assert set(runs.set_index("run_id").loc[data.default_selection(sweeps_only), "algorithm"]) == {"fedcache", "fd"}


def test_runs_beside_the_papers_figures_with_speed_ups_against_the_tables_reference(sample, tmp_path):
    from pipeline.results.store import ResultsDB

    path, root = tmp_path / "paper.duckdb", sample.root
    db, sizes = ResultsDB(path), np.full(sample_data.K, sample_data.PER_CLIENT)
    sample_data.write_run(db, "pfedme-1", "pfedme", "homo", sample_data.params_for(root), sizes,
                          sample_data.curve(0.70), seed=1)
    sample_data.write_run(db, "fd-1", "fd", "homo", sample_data.params_for(root), sizes, sample_data.curve(0.80), seed=2)
    sample_data.write_run(db, "fedavg-1", "fedavg", "homo", sample_data.params_for(root), sizes,
                          sample_data.curve(0.75), seed=3)  # the paper's tables have no FedAvg row
    sample_data.write_run(db, "fd-2", "fd", "hetero", sample_data.params_for(root, hetero=True), sizes,
                          sample_data.curve(0.78), seed=4)
    ids = ["pfedme-1", "fd-1", "fedavg-1", "fd-2"]
    snap = data.load_snapshot(path, ids)
    frame = data.paper_frame(snap, ids, 0.6).set_index("run_id")
    assert sorted(frame.index) == ["fd-1", "fd-2", "pfedme-1"]
    fd = frame.loc["fd-1"]  # Table 5, MNIST: FD 84.19 %, no GB or speed-up ('-'), reference pFedMe
    assert (fd["table"], fd["paper_maua"], fd["reference"]) == (5, pytest.approx(0.8419), "pfedme")
    assert fd["difference"] == pytest.approx((fd["maua"] - 0.8419) * 100)
    assert pd.isna(fd["paper_gb"]) and pd.isna(fd["paper_speedup"])
    against_pfedme = data.comparison_frame(snap, ids, 0.6, baseline="pfedme").set_index("run_id")
    assert fd["speedup"] == pytest.approx(against_pfedme.at["fd-1", "speedup"]) and fd["speedup"] > 1
    assert frame.at["pfedme-1", "speedup"] == pytest.approx(1.0) and frame.at["pfedme-1", "paper_speedup"] == 1.0
    assert frame.at["pfedme-1", "gb_total"] == pytest.approx(against_pfedme.at["pfedme-1", "bytes_total"] / 1e9)
    hetero = frame.loc["fd-2"]  # Table 6, whose reference (FedDKC) is not selected: no measured speed-up
    assert (hetero["table"], hetero["reference"], hetero["paper_maua"]) == (6, "feddkc", pytest.approx(0.7990))
    assert pd.isna(hetero["speedup"])


def _run_files(tmp_path, names=("fedcache", "local")):
    """Intact per-run files (2 rounds each) under tmp_path/runs, older than any index made after them."""
    from pipeline.results.store import RunResultsDB

    for name in names:
        run = RunResultsDB(tmp_path / "runs" / name / "run.duckdb")
        run.start_run(f"{name}-1", name, "mnist", "homo", {}, "abc")
        for r in range(3):
            run.write_round(f"{name}-1", r, 0.3 + 0.1 * r, 10, 10, 1.0, [(0, 0.3 + 0.1 * r, 10)], [], {})
        run.finish_run(f"{name}-1")
        _age(run.path, 60)


def test_a_damaged_or_empty_index_gives_way_to_the_per_run_files_with_a_warning(tmp_path):
    from pipeline.results.store import ResultsDB

    _run_files(tmp_path)
    index = tmp_path / "results.duckdb"
    index.write_bytes(b"not a database" * 1000)
    notices = []
    assert sorted(data.load_runs(index, notices=notices)["run_id"]) == ["fedcache-1", "local-1"]
    [(kind, text)] = notices
    assert kind == "warning" and f"`{index}` is damaged" in text and "2 per-run files" in text
    assert f"python -m pipeline.results.store rebuild --index {index}" in text

    index.unlink()
    with ResultsDB(index).connect():  # a valid index with no run, newer than the per-run files
        pass
    notices = []
    runs = data.load_runs(index, notices=notices)
    assert sorted(runs["run_id"]) == ["fedcache-1", "local-1"] and set(runs["n_rounds"]) == {3}
    assert notices[0][0] == "warning" and "holds no run" in notices[0][1]
    snap = data.load_snapshot(index, ["fedcache-1"])  # the views read the same files
    assert snap.rounds["round"].tolist() == [0, 1, 2]


def test_per_run_files_newer_than_the_index_are_read_and_named(tmp_path):
    from pipeline.results.store import rebuild_index

    _run_files(tmp_path, ["fedcache"])
    index = tmp_path / "results.duckdb"
    rebuild_index(index)
    _run_files(tmp_path, ["local"])
    (tmp_path / "runs" / "local" / "run.duckdb").touch()  # written after the index was built
    notices = []
    assert sorted(data.load_runs(index, notices=notices)["run_id"]) == ["fedcache-1", "local-1"]
    [(kind, text)] = notices
    assert kind == "info" and "1 per-run file(s)" in text and "rebuild" in text


def test_smoothing_draws_an_ema_per_run_and_keeps_the_measured_values():
    curves = pd.DataFrame({"run_id": ["a"] * 3 + ["b"] * 2, "run": ["a"] * 3 + ["b"] * 2,
                           "mean_acc": [0.0, 1.0, 1.0, 0.5, 0.5]})
    out = data.smoothed(curves, 0.5)
    # bias-corrected EMA, weight 0.5: 0, (1 + 0.5 * 0) / 1.5, (1 + 0.5 + 0.25 * 0) / 1.75; each run on its own
    assert out["mean_acc"].tolist() == pytest.approx([0.0, 2 / 3, 1.5 / 1.75, 0.5, 0.5])
    assert out["mean_acc_raw"].tolist() == curves["mean_acc"].tolist()
    assert data.smoothed(curves, 0.0)["mean_acc"].tolist() == curves["mean_acc"].tolist()
    spec = charts.accuracy_vs_round(out.assign(round=[0, 1, 2, 0, 1], cum_s=0.0, cum_bytes=0, algorithm="fd"))
    assert [t.get("title") for t in spec.to_dict()["encoding"]["tooltip"]][2:4] == ["mean accuracy", "smoothed"]
    assert any(p.get("bind") == "scales" for p in spec.to_dict().get("params", []))  # zoom and pan


# ----------------------------------------------------------------------------- 95% intervals and ties (issue 36)

def _styles(styler) -> dict[tuple[int, str], str]:
    """(row, column) -> the CSS a Styler gives that cell, for the cells it styles."""
    styler._compute()
    cols = list(styler.data.columns)
    return {(r, cols[c]): "; ".join(f"{k}: {v}" for k, v in props) for (r, c), props in styler.ctx.items() if props}


def test_the_comparison_carries_each_runs_95_percent_intervals(sample):
    """series() gives each run its seed and its clients' rows, so the table's MAUA and final accuracy carry the
    report's intervals (pipeline.results.compare over the same file's rows, read by the results store: another
    path) and show them as '80% [74, 84]'. Defect it catches: series() without the client rows (every interval
    NaN, the table showing bare percentages), or rows cut to one round (other bounds)."""
    from pipeline.results.compare import comparison

    ids = [sample.run_ids[k] for k in ("fedcache", "local", "fedcache_hetero")]
    snap = data.load_snapshot(sample.results_db, ids)
    runs = data.series(snap, ids)
    assert [s.seed for s in runs] == [0, 0, 0]
    assert [len(s.clients) for s in runs] == [sample_data.K * (sample_data.ROUNDS + 1)] * 3
    assert [len(s.val_clients) for s in runs] == [sample_data.K * (sample_data.ROUNDS + 1)] * 3
    table = data.comparison_frame(snap, ids, 0.6, runs=runs).set_index("run_id")
    report = {r["run_id"]: r for r in comparison(ResultsDB(sample.results_db).series(ids), 0.6)}
    for rid in ids:
        for col in data.TABLE_INTERVALS:
            assert table.at[rid, col] == pytest.approx(report[rid][col]), (rid, col)
        assert table.at[rid, "maua_low"] < table.at[rid, "maua"] < table.at[rid, "maua_high"]
    shown = data.display_table(table.reset_index()).set_index("run_id")
    fed = table.loc[ids[0]]
    assert shown.at[ids[0], "maua"] == "80% [74, 84]" == \
        f"{fed['maua']:.0%} [{fed['maua_low'] * 100:.0f}, {fed['maua_high'] * 100:.0f}]"  # whole points: +-5
    assert shown.at[ids[1], "maua"] == "64.6% [62.9, 66.6]"  # a narrower interval: tenths
    assert data.accuracy_text(0.5) == "50.00%" and data.accuracy_text(None) == "—"  # no interval: no brackets


def _tied(tmp_path, sample):
    path = tmp_path / "tied.duckdb"
    ids = sample_data.write_tied_runs(ResultsDB(path), sample.root)
    picked = [ids["fedcache"], ids["variant"]]
    snap = data.load_snapshot(path, picked)
    return snap, picked, data.series(snap, picked)


def test_two_runs_the_intervals_cannot_tell_apart_are_tied_and_neither_is_best(sample, tmp_path):
    """On write_tied_runs' pair (0.2 points apart, clients 8 points apart): the paired difference's interval
    contains 0, so the differences table says "tied", both runs get the same mark (TIED, not BEST), the caption
    says "tied", and on the Pareto frontier (same bytes) neither is "on the frontier": both on its band.
    Defects it catches: a best mark by the highest estimate (one BEST cell), leaders or frontier by the
    estimates alone (one run, or the lower one off the frontier)."""
    snap, picked, runs = _tied(tmp_path, sample)
    rows = data.differences(data.named_series(snap, runs))
    assert [(r["label"], r["vs"], r["maua_verdict"]) for r in rows] == [
        ("fedcache (beta=2.0)/homo tiedb2", "fedcache/homo tieda1", "tied")]
    assert rows[0]["maua_low"] < 0 < rows[0]["maua_high"]
    shown = data.difference_table(rows)
    assert shown["verdict"].tolist() == ["tied"] and re.fullmatch(r"[+-]\d+ \[-\d+, \+\d+\]", shown.iat[0, 3])

    leaders, ties = data.maua_leaders(runs)
    assert set(leaders) == set(picked) and [v.how for v in ties.values()] == ["paired"]
    assert "tied between" in data.best_maua_text(runs, leaders, ties, snap.label)
    table = data.comparison_frame(snap, picked, 0.6, runs=runs)
    styles = _styles(data.sortable_table(table, leaders=leaders))
    assert {k: v for k, v in styles.items() if k[1] == "maua"} == {(0, "maua"): data.TIED, (1, "maua"): data.TIED}
    assert data.BEST not in [v for k, v in styles.items() if k[1] == "maua"]

    pts = data.pareto_points(table, runs=runs).set_index("run")
    assert pts["frontier"].all() and pts["tied"].all()  # both on the frontier's band, neither on the frontier itself
    assert pts.at["fedcache/homo tieda1", "tied_with"] == "fedcache (beta=2.0)/homo tiedb2"


def test_a_clear_leader_is_best_and_ahead(sample):
    """The control: FedCache 16 points above local-only (6 clients): "ahead" in the differences, one BEST mark,
    the caption names it without "tied", and local-only (no bytes) is on the frontier, not tied. Defect it
    catches: everything called tied (a verdict that ignores the interval's sign)."""
    ids = [sample.run_ids[k] for k in ("fedcache", "local")]
    snap = data.load_snapshot(sample.results_db, ids)
    runs = data.series(snap, ids)
    rows = data.differences(data.named_series(snap, runs))
    assert [(r["label"], r["vs"], r["maua_verdict"]) for r in rows] == [
        ("fedcache/homo aaaaaa", "local/homo bbbbbb", "ahead")]
    leaders, ties = data.maua_leaders(runs)
    assert leaders == [ids[0]] and not ties
    assert "tied" not in data.best_maua_text(runs, leaders, ties, snap.label)
    table = data.comparison_frame(snap, ids, 0.6, runs=runs)
    styles = _styles(data.sortable_table(table, leaders=leaders))
    assert {k: v for k, v in styles.items() if k[1] == "maua"} == {(0, "maua"): data.BEST}
    pts = data.pareto_points(table, runs=runs).set_index("run")
    assert pts["frontier"].all() and not pts["tied"].any()  # local: nothing is cheaper; FedCache: ahead of it


def test_without_pairing_overlapping_intervals_are_a_tie():
    """Runs that cannot be paired (another seed or partition; here a table alone) are compared by their own
    intervals: the best mark goes to every run whose interval overlaps the top's, and the frontier keeps a run
    that a cheaper run is only ahead of by its estimate. Defect it catches: ties decided by the estimates."""
    table = pd.DataFrame({
        "run": ["top", "close", "apart", "costly_close", "free"], "run_id": ["a", "b", "c", "d", "e"],
        "algorithm": ["fedcache", "fd", "fedavg", "fedproto", "local"], "setting": ["homo"] * 5,
        "maua": [0.70, 0.68, 0.60, 0.66, 0.50], "maua_low": [0.65, 0.63, 0.58, 0.60, 0.48],
        "maua_high": [0.75, 0.73, 0.62, 0.72, 0.52], "bytes_total": [1e6, 5e5, 2e6, 3e6, 0],
        "bytes_training": [1e6, 5e5, 2e6, 3e6, 0]})
    assert data.overlap_leaders(table) == [0, 1, 3]  # 'apart' (0.58-0.62) is below the top's 0.65
    pts = data.pareto_points(table).set_index("run")
    # 'apart': 'top' is ahead of it beyond a tie with fewer bytes; 'costly_close' overlaps every cheaper run's
    # interval but 'free''s, and 'free' is below it: nobody beats it beyond a tie
    assert pts["frontier"].to_dict() == {"free": True, "close": True, "top": True, "apart": False,
                                         "costly_close": True}
    assert pts["tied"].to_dict() == {"free": False, "close": True, "top": True, "apart": False,
                                     "costly_close": True}
    assert pts.at["costly_close", "tied_with"] == "top, close"


def test_seed_groups_compare_across_seeds(sample, tmp_path):
    """With Group seeds, runs are named by their seed group, so compare.differences pairs FedCache's 3 seeds with
    local-only's 3 seeds seed by seed: the difference is the mean of the per-seed MAUA differences, with a t
    interval over those 3 (by hand here). Defect it catches: the runs named one by one (9 pairs of one seed)."""
    path = tmp_path / "seeds.duckdb"
    db = ResultsDB(path)
    ids = sample_data.write_seed_runs(db, sample.root)
    local = {0: ids.pop(-1)}
    for seed in (1, 2):
        local[seed] = f"local-20260301-0099{seed:02d}-loc{seed:03d}"
        sample_data.write_run(db, local[seed], "local", "homo", {**sample_data.params_for(sample.root), "seed": seed},
                              np.full(sample_data.K, sample_data.PER_CLIENT), sample_data.curve(0.64 + 0.01 * seed),
                              seed=20 + seed)
    picked = [*ids.values(), *local.values()]
    snap = data.load_snapshot(path, picked)
    runs = data.series(snap, picked)
    rows = [r for r in data.differences(data.named_series(snap, runs, group_seeds=True))
            if r["vs"] == "local/homo ffffff (3 seeds)"]
    assert [(r["label"], r["seeds"]) for r in rows] == [("fedcache/homo seed00 (3 seeds)", 3)]
    maua = {s.run_id: s.maua for s in runs}
    per_seed = np.array([maua[ids[k]] - maua[local[k]] for k in (0, 1, 2)])
    half = 4.302652729911275 * per_seed.std(ddof=1) / 3 ** 0.5
    assert (rows[0]["maua_diff"], rows[0]["maua_low"], rows[0]["maua_high"]) == pytest.approx(
        (per_seed.mean(), per_seed.mean() - half, per_seed.mean() + half))
    assert rows[0]["maua_verdict"] == "ahead" and rows[0]["covers"].startswith("3 seeds")
