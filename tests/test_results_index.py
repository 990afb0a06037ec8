"""Results that can always be rebuilt: each training stage writes its rows into its own
results/runs/<name>/run.duckdb, and results/results.duckdb is an index built from those files.
Deleted or damaged, the index comes back with the same rows (the report says so when it was
damaged); a damaged per-run file stops the rebuild and the report with one line naming it and the
stage to re-run; a new run clears what an earlier run left in its file."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import duckdb
import pytest

from conftest import make_workspace
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.results.labels import run_label
from pipeline.train.engine import Trainer
from pipeline.results.store import TABLES, ResultsError, RunResultsDB, main as results_cli, rebuild_index, run_files


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py), a quarter of the convolution:
    these runs check what is written and indexed, not what is learnt."""
    return small_mnist


RUNS = [("fedcache", False), ("local", False), ("local", True)]
GARBAGE = bytes(range(256)) * 64  # 16 KiB that are no DuckDB file


def _trainer(params, part, mnist, algorithm: str, hetero: bool = False) -> Trainer:
    """A trainer as flows/train.py builds one: the stage's own results file, the run's git and DVC facts."""
    from flows.train import run_info

    return Trainer(params, REGISTRY[algorithm], part, mnist, paths.run_dir(algorithm, hetero),
                   paths.checkpoint_path(algorithm, hetero), RunResultsDB(paths.run_results(algorithm, hetero)),
                   [paths.PARTITION], hetero, run_info(params))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mnist):
    """Tiny finished runs of fedcache, local and local-hetero (2 rounds), as the training stages leave them."""
    root = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        _, params, part = make_workspace(root, mnist, {"train": {
            "rounds": 2, "algorithms": ["fedcache", "local"], "hetero_algorithms": ["local"],
            "executor": "sequential"},  # the fastest here for 3 tiny clients; where rows go does not depend on it
            # a knob off its default: the run's label says so; round: step needs the vectorized executor
            "fedcache": {"T": 1.0, "consistency": "round"}})
        for algorithm, hetero in RUNS:
            summary = _trainer(params, part, mnist, algorithm, hetero).run()
            (paths.run_dir(algorithm, hetero) / "summary.json").write_text(json.dumps(summary))
    return root, params


@pytest.fixture
def workspace(trained, tmp_path, monkeypatch):
    """A fresh copy of the trained results (and params.yaml) as the working directory; returns the params."""
    root, params = trained
    shutil.copytree(root / "results", tmp_path / "results")
    shutil.copy(root / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    return params


def _rows(path, tables=TABLES) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables}
    finally:
        con.close()


def _label(path) -> str:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT label FROM runs").fetchone()[0]
    finally:
        con.close()


def _per_run_rows() -> dict[str, Counter]:
    """Every table's rows over all per-run files (as multisets), as the index should hold them."""
    out = {t: Counter() for t in TABLES}
    for path in run_files(paths.RUNS):
        for t, rows in _rows(path).items():
            out[t].update(rows)
    return out


def _report(params):
    from flows.report import make_report, stage_runs

    return make_report(params, stage_runs(params))


def test_each_stage_writes_its_own_file(workspace):
    assert [p.parent.name for p in run_files(paths.RUNS)] == ["fedcache", "local", "local-hetero"]
    for path in run_files(paths.RUNS):
        rows = _rows(path)
        assert len(rows["runs"]) == 1 and rows["runs"][0][8] == "finished"  # one run per file; [8]: status
        assert [r[1] for r in rows["rounds"]] == [0, 1, 2]
    # the label the trainer wrote when the run started: the method and its non-default knobs (issue 22)
    labels = {p.parent.name: _label(p) for p in run_files(paths.RUNS)}
    assert labels == {"fedcache": run_label(workspace, "fedcache"), "local": "local", "local-hetero": "local"}
    assert labels["fedcache"].startswith("fedcache (") and "T=1.0" in labels["fedcache"]
    assert not paths.RESULTS_DB.exists()  # training writes no index


def test_index_deleted_then_rebuilt_holds_the_same_rows(workspace, capsys):
    rows = _report(workspace)
    assert "built from 3 per-run file(s) (3 runs)" in capsys.readouterr().out
    index = _rows(paths.RESULTS_DB, (*TABLES, "comparison"))
    expected = _per_run_rows()
    assert {t: Counter(index[t]) for t in TABLES} == expected
    assert all(expected[t] for t in ("runs", "rounds", "client_rounds", "comm"))
    assert sorted(r[3] for r in index["comparison"]) == sorted(r["run_id"] for r in rows)  # the report's table
    assert f"| {_label(paths.run_results('fedcache'))} | homo |" in (paths.REPORT_DIR / "comparison.md").read_text()

    paths.RESULTS_DB.unlink()
    assert results_cli(["rebuild"]) == 0  # the on-demand command; the comparison from the report's CSV
    assert "built from 3 per-run file(s)" in capsys.readouterr().out
    assert _rows(paths.RESULTS_DB, (*TABLES, "comparison")) == index


def test_damaged_index_is_rebuilt_and_said_so(workspace, capsys):
    _report(workspace)
    before = _rows(paths.RESULTS_DB, (*TABLES, "comparison"))

    paths.RESULTS_DB.write_bytes(GARBAGE)
    _report(workspace)  # the report stage rebuilds it
    out = capsys.readouterr().out
    assert f"{paths.RESULTS_DB} was damaged (" in out and "rebuilt from 3 per-run file(s)" in out
    assert _rows(paths.RESULTS_DB, (*TABLES, "comparison")) == before

    paths.RESULTS_DB.write_bytes(GARBAGE)
    assert results_cli(["rebuild"]) == 0  # and so does the command
    assert "was damaged" in capsys.readouterr().out
    assert _rows(paths.RESULTS_DB, (*TABLES, "comparison")) == before
    assert not list(paths.RESULTS.glob("results.duckdb.tmp*"))  # no temporary file left behind


@pytest.mark.parametrize("name, stage", [("local", "train@local"), ("local-hetero", "train-hetero@local")])
def test_damaged_per_run_file_gives_one_clear_line(workspace, capsys, name, stage):
    from flows.cli import run_stage
    from flows.report import make_report, stage_runs
    from pipeline.config import load_params

    _report(workspace)
    index = paths.RESULTS_DB.read_bytes()
    damaged = paths.RUNS / name / paths.RUN_RESULTS
    damaged.write_bytes(GARBAGE)

    with pytest.raises(ResultsError) as err:
        rebuild_index()
    message = str(err.value)
    assert str(damaged) in message and f"dvc repro -s -f {stage}" in message and "\n" not in message
    assert paths.RESULTS_DB.read_bytes() == index  # the old index stays as it was
    assert not list(paths.RESULTS.glob("results.duckdb.tmp*"))

    capsys.readouterr()
    assert results_cli(["rebuild"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"

    # the report stage: one `error:` line (flows/cli.py), exit code 2
    rc = run_stage(lambda params_file: make_report(load_params(params_file), stage_runs(load_params(params_file))),
                   argv=["--params", "params.yaml"])
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err_lines) == 1 and err_lines[0].startswith("error: ") and str(damaged) in err_lines[0]


def test_foreign_duckdb_file_is_named_too(workspace):
    foreign = paths.RUNS / "local" / paths.RUN_RESULTS
    foreign.unlink()
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE runs (id INTEGER)")  # a DuckDB file, but not a results file
    con.close()
    with pytest.raises(ResultsError, match="table runs has no column"):
        rebuild_index()


def test_new_run_clears_its_file_and_a_damaged_file_is_not_resumed(tiny_workspace, mnist, capsys):
    _, params, part = tiny_workspace
    params = params.model_copy(update={"train": params.train.model_copy(update={"executor": "sequential",
                                                                                 "checkpoint_every": 1})})
    results = paths.run_results("local")
    results.parent.mkdir(parents=True)
    results.write_bytes(GARBAGE)  # left by an earlier run
    first = _trainer(params, part, mnist, "local")
    assert first.start() == 1  # a new run: the stale file is replaced
    first.run_round(1)  # checkpointed
    assert [r[0] for r in _rows(results)["runs"]] == [first.run_id]

    again = _trainer(params, part, mnist, "local")
    assert again.start() == 2 and again.run_id == first.run_id  # resumes: its rows are there

    results.write_bytes(GARBAGE)  # damaged while the run was down: the checkpoint alone cannot rebuild it
    capsys.readouterr()
    fresh = _trainer(params, part, mnist, "local")
    assert fresh.start() == 1 and fresh.run_id != first.run_id
    assert f"cannot resume run {first.run_id}" in capsys.readouterr().out
    assert [r[0] for r in _rows(results)["runs"]] == [fresh.run_id]


def test_a_round_of_many_rows_is_written_as_given(tmp_path):
    """write_round's rows go in one statement per table (insert_rows): a paper-scale round's 300 clients and 600
    payload rows come back value for value, NULLs, NaN and numpy scalars included."""
    import numpy as np

    db = RunResultsDB(tmp_path / "run.duckdb")
    db.start_run("r", "fedcache", "mnist", "homo", {}, "abc")
    clients = [(k, float(k) / 300, 10 + k, None if k % 7 else 0.5, None if k % 7 else np.int64(3)) for k in range(300)]
    clients[5] = (5, float("nan"), 0, None, None)
    comm = [(1, np.int64(k), d, "logits", 100 * k + (d == "up"), -1 if k % 2 else None, 0.25 * k if k % 3 else None)
            for k in range(300) for d in ("up", "down")]
    db.write_round("r", 1, 0.5, 1, 2, 0.1, clients, comm, {"cache_coverage": 0.75, "val_acc": np.float64(0.4)})
    con = duckdb.connect(str(tmp_path / "run.duckdb"), read_only=True)
    got = con.execute("SELECT client_id, acc, n_test, val_acc, n_val FROM client_rounds ORDER BY client_id").fetchall()
    expected = [(k, acc, n, val, None if n_val is None else int(n_val)) for k, acc, n, val, n_val in clients]
    assert got[:5] + got[6:] == expected[:5] + expected[6:]
    assert np.isnan(got[5][1]) and got[5][2:] == (0, None, None)
    assert con.execute("SELECT client_id, direction, kind, bytes, peer_id, sim_time_s FROM comm "
                       "ORDER BY client_id, direction DESC").fetchall() == [(int(k), d, kind, b, peer, t)
                                                                           for _, k, d, kind, b, peer, t in comm]
    assert dict(con.execute("SELECT name, value FROM round_metrics").fetchall()) == {"cache_coverage": 0.75,
                                                                                    "val_acc": 0.4}
    con.close()


def test_a_file_from_before_new_columns_gets_them_when_written_and_is_released_after(tmp_path):
    """A run file written before comm.peer_id, the validation columns and the simulated clock existed: a writer
    adds them (RUN_SCHEMA's ALTERs) and its rows land; a file whose schema is current is left as it is. Between
    connections the file is free: another connection opens it for writing at once."""
    path = tmp_path / "run.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE comm (run_id VARCHAR, round INTEGER, client_id INTEGER, direction VARCHAR, "
                "kind VARCHAR, bytes BIGINT)")
    con.execute("CREATE TABLE client_rounds (run_id VARCHAR, round INTEGER, client_id INTEGER, acc DOUBLE, "
                "n_test INTEGER, PRIMARY KEY (run_id, round, client_id))")
    con.close()
    db = RunResultsDB(path)
    db.start_run("r", "pdfl", "mnist", "homo", {}, "abc")
    db.write_round("r", 1, 0.5, 10, 0, 0.1, [(0, 0.5, 3, 0.25, 2)], [(1, 0, "up", "model", 10, 1, 2.5)])
    con = duckdb.connect(str(path))  # the writer let go of the file
    assert con.execute("SELECT peer_id, sim_time_s FROM comm").fetchall() == [(1, 2.5)]
    assert con.execute("SELECT val_acc, n_val FROM client_rounds").fetchall() == [(0.25, 2)]
    con.close()
