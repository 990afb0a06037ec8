"""Run labels (issue 22): a run is named by its method plus its non-default knobs, in DuckDB and the report."""

from __future__ import annotations

import csv
import json

import duckdb

from pipeline.config import parse_params
from pipeline.methods import registry
from pipeline.results.compare import RunSeries, comparison
from pipeline.results.labels import run_label
from pipeline.results.report import write_outputs
from pipeline.results.store import RUN_SCHEMA, ResultsDB, RunResultsDB, rebuild_index


def _label(algorithm: str, section: dict) -> str:
    return run_label(parse_params({algorithm: section}), algorithm)


def test_a_section_of_defaults_gives_the_bare_name():
    params = parse_params({})  # every section at its pydantic defaults (params.yaml's values play no part)
    assert {m: run_label(params, m) for m in registry.names()} == {m: m for m in registry.names()}
    assert _label("fedcache", {"beta": 1.5, "T": 3.0}) == "fedcache"  # written out, but the defaults
    assert _label("local", {}) == "local"  # no knobs at all


def test_one_and_two_knobs_in_the_order_the_model_declares_them():
    assert _label("pdfl", {"order": "body_then_head"}) == "pdfl (order=body_then_head)"
    # given the other way round, and beside a default value, which is left out
    assert _label("fedcache", {"consistency": "live", "beta": 1.5, "T": 1.0}) == "fedcache (T=1.0, consistency=live)"


def test_a_knob_with_an_alias_is_written_as_params_yaml_spells_it():
    assert _label("fedproto", {"lambda": 2.0}) == "fedproto (lambda=2.0)"
    assert _label("pfedme", {"personal_lr": 0.05, "lambda": 20}) == "pfedme (lambda=20.0, personal_lr=0.05)"


def test_values_are_written_compactly():
    assert (_label("pdfl", {"heads": 2, "attention": False, "attention_lr": 0.001, "attention_samples": None})
            == "pdfl (heads=2, attention=false, attention_lr=0.001, attention_samples=null)")
    assert _label("fedalt", {"capacity": [0.4, 0.3, 0.3]}) == "fedalt (capacity=[0.4,0.3,0.3])"


def _old_file(path):
    """A results file as written before labels: its runs table has no label column."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    con.execute(RUN_SCHEMA)
    con.execute("ALTER TABLE runs DROP COLUMN label")
    con.execute("INSERT INTO runs (run_id, algorithm, dataset, setting, params, git_rev, status) "
                "VALUES ('fd-old', 'fd', 'mnist', 'homo', '{}', 'abc', 'finished')")
    con.execute("INSERT INTO rounds (run_id, round, mean_acc, bytes_up, bytes_down, wall_s) "
                "VALUES ('fd-old', 0, 0.5, 0, 0, 0.1)")
    con.close()


def test_the_label_lands_in_duckdb_and_the_index(tmp_path):
    db = RunResultsDB(tmp_path / "runs" / "pdfl" / "run.duckdb")
    db.start_run("pdfl-1", "pdfl", "mnist", "homo", {}, "abc", label="pdfl (order=body_then_head)")
    db.write_round("pdfl-1", 0, 0.5, 10, 10, 0.1, [], [])
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT algorithm, label FROM runs").fetchall() == [("pdfl", "pdfl (order=body_then_head)")]
    [series] = db.series(["pdfl-1"])
    assert (series.algorithm, series.label, series.name) == ("pdfl", "pdfl (order=body_then_head)",
                                                             "pdfl (order=body_then_head)")

    _old_file(tmp_path / "runs" / "fd" / "run.duckdb")
    [old] = ResultsDB(tmp_path / "runs" / "fd" / "run.duckdb").series(["fd-old"])  # read-only: not migrated
    assert (old.label, old.name) == (None, "fd")

    index = tmp_path / "results.duckdb"
    rows = comparison([series, old], target=None)
    assert rebuild_index(index, comparison=("r", rows)).runs == 2
    con = duckdb.connect(str(index), read_only=True)
    try:
        assert con.execute("SELECT run_id, label FROM runs ORDER BY run_id").fetchall() == [
            ("fd-old", None), ("pdfl-1", "pdfl (order=body_then_head)")]
        assert con.execute("SELECT algorithm, label FROM comparison ORDER BY run_id").fetchall() == [
            ("fd", "fd"), ("pdfl", "pdfl (order=body_then_head)")]
    finally:
        con.close()


def test_an_old_file_gets_the_column_when_next_written(tmp_path):
    path = tmp_path / "results.duckdb"
    _old_file(path)
    db = ResultsDB(path)
    db.start_run("fd-new", "fd", "mnist", "homo", {}, "abc", label="fd (gamma=0.5)")
    with db.connect(read_only=True) as con:
        assert con.execute("SELECT run_id, label FROM runs ORDER BY run_id").fetchall() == [
            ("fd-new", "fd (gamma=0.5)"), ("fd-old", None)]


def test_the_report_names_each_run_by_its_label(tmp_path):
    runs = [RunSeries("pdfl-1", "pdfl", "homo", [(0, 0.1, 10, 0), (1, 0.8, 10, 0)], "pdfl (order=body_then_head)"),
            RunSeries("fd-1", "fd", "hetero", [(0, 0.1, 5, 0), (1, 0.7, 5, 0)])]  # from before labels
    rows = comparison(runs, target=0.75)
    assert [(r["algorithm"], r["label"]) for r in rows] == [("pdfl", "pdfl (order=body_then_head)"), ("fd", "fd")]
    write_outputs(rows, tmp_path / "metrics.json", tmp_path / "report")
    md = (tmp_path / "report" / "comparison.md").read_text()
    assert md.startswith("| method | setting |")
    assert "| pdfl (order=body_then_head) | homo | 1 |" in md and "| fd | hetero | 1 |" in md
    with open(tmp_path / "report" / "comparison.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [(r["algorithm"], r["label"]) for r in read] == [("pdfl", "pdfl (order=body_then_head)"), ("fd", "fd")]
    # metrics.json keeps the bare method as its key (dvc metrics diff pairs stages by it)
    assert sorted(json.loads((tmp_path / "metrics.json").read_text())) == ["fd-hetero", "pdfl"]


def test_only_the_methods_own_section_counts():
    params = parse_params({"train": {"rounds": 3, "lr": 0.1}, "partition": {"num_clients": 5}, "fedcache": {"T": 1.0}})
    assert run_label(params, "local") == "local"
    assert run_label(params, "fedcache") == "fedcache (T=1.0)"


def test_the_schedule_is_in_the_label_when_not_a_plain_sync_run():
    """Issue 24: two runs of one method under different schedules must not share a name."""
    on = {"enabled": True}
    assert run_label(parse_params({"devices": on, "train": {"schedule": "deadline", "deadline_quantile": 0.8,
                                                             "algorithms": ["fedavg"]}}),
                     "fedavg") == "fedavg (schedule=deadline)"
    assert run_label(parse_params({"devices": on, "train": {"schedule": "async", "algorithms": ["fedcache"]},
                                   "fedcache": {"consistency": "round"}}),
                     "fedcache") == "fedcache (consistency=round, schedule=async)"
    # devices on, sync: its simulated times set it apart from a plain run
    assert run_label(parse_params({"devices": on}), "fd") == "fd (schedule=sync)"
    assert run_label(parse_params({"devices": {"enabled": False}}), "fd") == "fd"  # devices off, sync: as before
    # the report and metrics.json: the label shown, the bare name kept as the key
    rows = comparison([RunSeries("a-1", "fedavg", "homo", [(0, 0.1, 10, 0), (1, 0.8, 10, 0)],
                                 "fedavg (schedule=deadline)")], target=0.75)
    assert [(r["algorithm"], r["label"]) for r in rows] == [("fedavg", "fedavg (schedule=deadline)")]
