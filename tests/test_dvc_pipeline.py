"""A tiny end-to-end `dvc repro` in a temporary copy of the repo (real Prefect flows, real data).

The tests share the session's built copy (tests/conftest.py: `built_repo`) and each starts from
the same state: the tiny params and every stage built from them (the `repo` fixture puts
params.yaml back and runs `dvc repro`, which does nothing unless an earlier test changed something,
and then restores outputs from DVC's run cache), so the tests pass alone and in any order.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml


ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _run(cmd, cwd, check=True):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture
def repo(built_repo):
    """The session's built copy (tests/conftest.py), back in its built state whatever an earlier test changed."""
    built_repo.restore()
    return built_repo.path


def _set_params(repo, **changes):
    """Edit params.yaml: _set_params(repo, **{"index.R": 5})."""
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for key, value in changes.items():
        section, name = key.split(".")
        params[section][name] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _ran(out) -> set[str]:
    return {line.split("'")[1] for line in out.stdout.splitlines() if line.startswith("Running stage")}


def _changed_stages(repo) -> set[str]:
    """The stages `dvc status` finds changed (what `dvc repro` reruns, with the stages downstream of them)."""
    return set(json.loads(_run(["dvc", "status", "--json"], repo).stdout or "{}"))


def test_repro_builds_every_stage(built_repo, repo):
    first = built_repo.build_output
    for stage in ("partition", "encode", "index", "train@fedcache", "train@local", "report"):
        assert f"Running stage '{stage}'" in first
    part = np.load(repo / "data/partition/partition.npz")
    assert int(part["train_offsets"][-1]) == 240
    assert np.load(repo / "data/hashes/hashes.npy").shape[0] == 240
    assert np.load(repo / "data/cache/relations.npy").shape == (240, 3)
    assert (repo / "data/cache/cache.db").stat().st_size > 0


def test_repro_fills_every_results_table(repo):
    # the runs the current outputs come from (earlier tests may have left other runs in the DB)
    ids = {alg: json.loads((repo / f"results/runs/{alg}/summary.json").read_text())["run_id"]
           for alg in ("fedcache", "local")}
    con = duckdb.connect(str(repo / "results/results.duckdb"), read_only=True)
    try:
        for alg, run_id in ids.items():
            assert con.execute("SELECT algorithm, status FROM runs WHERE run_id = ?", [run_id]).fetchall() == [
                (alg, "finished")]
            n_rounds = con.execute("SELECT count(*) FROM rounds WHERE run_id = ?", [run_id]).fetchone()[0]
            n_clients = con.execute("SELECT count(DISTINCT client_id) FROM client_rounds WHERE run_id = ?",
                                    [run_id]).fetchone()[0]
            assert n_rounds == 3 and n_clients == 4  # rounds 0 (set-up), 1, 2; every client evaluated
        kinds = con.execute("SELECT DISTINCT kind FROM comm WHERE run_id = ? ORDER BY kind", [ids["fedcache"]]).fetchall()
        assert kinds == [("hashes",), ("knowledge",), ("logits",)]
        assert con.execute("SELECT count(*) FROM comm WHERE run_id = ?", [ids["local"]]).fetchone()[0] == 0
    finally:
        con.close()
    for alg in ("fedcache", "local"):  # the index holds what each stage wrote into its own file
        assert (repo / f"results/runs/{alg}/run.duckdb").is_file()
    metrics = json.loads((repo / "results/metrics.json").read_text())
    assert set(metrics) == {"fedcache", "local"} and metrics["local"]["bytes_total"] == 0
    assert (repo / "results/report/accuracy_vs_bytes.png").stat().st_size > 0
    shown = _run(["dvc", "metrics", "show"], repo).stdout
    assert "fedcache" in shown and "maua" in shown


def test_repro_of_a_built_repo_is_a_no_op(repo):
    out = _run(["dvc", "repro"], repo)
    assert "Running stage" not in out.stdout
    status = _run(["dvc", "status"], repo)
    assert "up to date" in status.stdout


def test_editing_R_reruns_only_index_and_what_reads_it(repo):
    _set_params(repo, **{"index.R": 5})
    assert _changed_stages(repo) == {"index"}
    assert _ran(_run(["dvc", "repro", "index"], repo)) == {"index"}  # the data stages before it stay as they are
    assert np.load(repo / "data/cache/relations.npy").shape == (240, 5)
    # the relation table changed: the stages that read the cache are what `dvc repro` reruns now
    assert _changed_stages(repo) == {"train@fedcache", "train@local"}


def test_bad_params_stop_the_stage_with_a_clear_error(repo):
    _set_params(repo, **{"partition.alpha": 0})
    before = (repo / "data/partition/partition.npz").stat().st_mtime_ns
    out = _run(["dvc", "repro"], repo, check=False)
    assert out.returncode != 0
    assert "partition.alpha" in out.stdout + out.stderr
    # DVC removes a stage's outputs before running it; our code wrote nothing new
    part = repo / "data/partition/partition.npz"
    assert not part.exists() or part.stat().st_mtime_ns == before


def test_editing_one_algorithms_params_changes_only_its_stage(repo):
    _set_params(repo, **{"fedcache.beta": 1.0})
    # its training stage and its audit (which reads the method's section: its encodings); then the report
    assert _changed_stages(repo) == {"train@fedcache", "audit@fedcache"}


@pytest.mark.parametrize("edited, stage", [("pipeline/methods/local/method.py", "train@local"),
                                           ("pipeline/methods/fedcache/params.py", "train@fedcache"),
                                           ("pipeline/methods/fedcache/knowledge.py", "train@fedcache")])
def test_editing_one_methods_code_changes_only_its_training_stage(repo, edited, stage):
    """A method's folder is a dep of its own training stage(s) and its audit only (the audit builds the method's
    models): the data stages and the other methods' stages stay up to date (the report follows once they have run)."""
    path = repo / edited
    before = path.read_text()
    try:
        path.write_text(before + "\n# an edit\n")
        assert _changed_stages(repo) == {stage, stage.replace("train@", "audit@")}
    finally:
        path.write_text(before)
    assert _changed_stages(repo) == set()


def test_editing_the_shared_core_changes_every_training_stage_and_no_data_stage(repo):
    path = repo / "pipeline/train/engine.py"
    before = path.read_text()
    try:
        path.write_text(before + "\n# an edit\n")
        assert _changed_stages(repo) == {"train@fedcache", "train@local"}
    finally:
        path.write_text(before)


def test_a_damaged_run_file_is_rewritten_by_the_command_its_error_names(repo):
    """The per-run file is the stage's (persisted) output: `dvc repro -s -f train@<name>` (what a damaged
    file's error says) reruns that stage alone, which replaces the file; the report then picks it up."""
    from pipeline.results.store import ResultsDB, rebuild_command

    run_file = repo / "results/runs/local/run.duckdb"
    run_file.write_bytes(b"garbage!" * 4096)
    command = rebuild_command("results/runs/local/run.duckdb")
    assert command == "dvc repro -s -f train@local"
    assert _ran(_run(command.split(), repo)) == {"train@local"}
    run_id = json.loads((repo / "results/runs/local/summary.json").read_text())["run_id"]
    [series] = ResultsDB(run_file).series([run_id])  # a readable file again, holding the new run
    assert [r[0] for r in series.rounds] == [0, 1, 2]
    assert _ran(_run(["dvc", "repro"], repo)) == {"audit@local", "report"}  # the new run audited, then reported
    con = duckdb.connect(str(repo / "results/results.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone() == ("finished",)
    finally:
        con.close()


def test_a_sweep_runs_its_experiments_two_at_once_into_the_index(repo):
    """`python -m pipeline.experiments.sweeps run` queues one DVC experiment per value, runs the queue with 2 jobs;
    each experiment's report stage publishes its runs to this checkout, tagged with its name and
    the params it changed (against the committed params.yaml)."""
    # a training knob: each experiment restores partition, encode and index from DVC's cache and trains
    (repo / "sweeps/tiny.yaml").write_text("# two learning rates\nvary:\n  train.lr: [0.05, 0.02]\n")
    try:
        out = _run([str(BIN / "python"), "-m", "pipeline.experiments.sweeps", "run", "tiny", "--jobs", "2",
                    "-S", "train.algorithms=[local]"], repo)
        assert "| tiny-lr-0.05 | train.lr=0.05 | local |" in out.stdout, out.stdout
        log = _run(["dvc", "queue", "logs", "tiny-lr-0.05"], repo).stdout  # the experiment's own repro
        assert "Running stage 'train@local'" in log and "Running stage 'partition'" not in log, log
        con = duckdb.connect(str(repo / "results/results.duckdb"), read_only=True)
        try:
            rows = con.execute("SELECT experiment, changed, algorithm, status FROM runs WHERE experiment IS NOT NULL "
                               "ORDER BY experiment").fetchall()
            workspace = con.execute("SELECT count(*) FROM runs WHERE experiment IS NULL").fetchone()[0]
        finally:
            con.close()
        assert [(e, json.loads(c), a, s) for e, c, a, s in rows] == [
            ("tiny-lr-0.02", {"train.lr": 0.02, "train.algorithms": ["local"]}, "local", "finished"),
            ("tiny-lr-0.05", {"train.lr": 0.05, "train.algorithms": ["local"]}, "local", "finished")]
        assert workspace == 2  # the workspace's own runs (fedcache, local) stay in the index beside them
    finally:  # the other tests see the repository as built
        (repo / "sweeps/tiny.yaml").unlink()
        import shutil

        shutil.rmtree(repo / "results/experiments", ignore_errors=True)
        _run([str(BIN / "python"), "-m", "pipeline.results.store", "rebuild"], repo)
