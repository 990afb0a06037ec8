"""Sweeps and parallel writers: the sweep files are checked before anything is queued, a run records
its DVC experiment and the params it changed, and runs written at once are neither lost nor mixed.

The sweep itself (queued DVC experiments run 2 at a time, published into the index) runs end to
end in tests/test_dvc_pipeline.py, in that module's tiny repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest
import yaml

from conftest import REPO_ROOT, make_workspace
from pipeline import paths
from pipeline.experiments import dvc as experiments
from pipeline.experiments import sweeps
from pipeline.config import ConfigError, load_params
from pipeline.experiments.dvc import Experiment
from pipeline.results.store import TABLES, rebuild_index, run_files


def test_the_paper_ablation_sweeps_plan_one_experiment_per_value(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert [p.name for p in sweeps.plan("ablation_R")] == [f"ablation_R-R-{r}" for r in (1, 4, 16, 64, 256)]
    assert [p.name for p in sweeps.plan("ablation_data_share")] == [
        "ablation_data_share-data_fraction-0.0033", "ablation_data_share-data_fraction-0.01",
        "ablation_data_share-data_fraction-0.05", "ablation_data_share-data_fraction-0.2"]
    planned = sweeps.plan("ablation_alpha")
    assert [p.name for p in planned] == ["ablation_alpha-alpha-1", "ablation_alpha-alpha-3", "ablation_alpha-alpha-10"]
    alpha3 = planned[1]
    assert alpha3.settings == {"train.algorithms": ["fedcache", "fd"], "train.hetero_algorithms": [],
                               "partition.alpha": 3}
    cmd = sweeps.queue_command(alpha3)
    assert cmd[1:6] == ["exp", "run", "--queue", "-n", "ablation_alpha-alpha-3"]  # no --force: unchanged stages are reused
    assert cmd[6:] == ["-S", "train.algorithms=[fedcache,fd]", "-S", "train.hetero_algorithms=[]",
                       "-S", "partition.alpha=3"]
    # extra -S flags go to every experiment and win
    assert all(p.settings["train.rounds"] == 3 for p in sweeps.plan("ablation_alpha", ["train.rounds=3"]))


@pytest.mark.parametrize("body, says", [
    ("vary:\n  partition.alfa: [1, 2]\n", "partition.alfa"),
    ("vary:\n  partition.alpha: [1, -2]\n", "partition.alpha"),
    ("vary:\n  partition.alpha: 3\n", "expected a list of values"),
    ("set:\n  train: {rounds: 2}\n", "expected `vary"),
    ("vary: [unclosed\n", "not valid YAML"),
])
def test_a_bad_sweep_file_is_refused_naming_file_and_key(tmp_path, monkeypatch, body, says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps/bad.yaml").write_text(body)
    with pytest.raises(ConfigError) as err:
        sweeps.plan("bad")
    assert says in str(err.value) and "sweeps/bad.yaml" in str(err.value)
    with pytest.raises(ConfigError, match="no sweep 'nope'.*sweeps: bad"):
        sweeps.plan("nope")
    assert sweeps.main(["run", "bad"]) == 2  # nothing queued: DVC is never called


def test_a_rerun_sweep_replaces_its_experiments_without_forcing_unchanged_stages(tmp_path, monkeypatch):
    """What `run` asks DVC, with a stand-in dvc that logs its arguments: an earlier experiment of a planned
    name is removed first (`--force` on the queue would replace it too, but rerun partition, encode and
    index in every experiment), then each is queued and the queue run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text((REPO_ROOT / "params.yaml").read_text())
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps/tiny.yaml").write_text("vary:\n  train.lr: [0.05, 0.02]\n")
    log = tmp_path / "dvc-calls"
    fake = tmp_path / "dvc"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                    '[ "$1 $2" = "exp list" ] && echo "tiny-lr-0.05 other-experiment"\nexit 0\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sweeps, "dvc_program", lambda: str(fake))
    assert sweeps.run("tiny", [], jobs=2) == 1  # the stand-in runs nothing, so nothing is published
    assert log.read_text().splitlines() == [
        "exp list --name-only",
        "exp remove tiny-lr-0.05",
        "exp run --queue -n tiny-lr-0.05 -S train.lr=0.05",
        "exp run --queue -n tiny-lr-0.02 -S train.lr=0.02",
        "exp run --run-all --jobs 2"]
    # a dvc that cannot list (no git repository, say): a clear error and nothing queued
    log.unlink()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\necho "not a git repository" >&2\nexit 1\n')
    assert sweeps.run("tiny", [], jobs=2) == 1
    assert log.read_text().splitlines() == ["exp list --name-only"]


def test_a_run_records_its_experiment_and_what_it_changed(tmp_path, monkeypatch, small_mnist):
    """As `dvc exp run` leaves the environment: the name, the baseline commit and the main checkout."""
    monkeypatch.chdir(tmp_path)
    mnist = small_mnist  # 14 x 14: what is recorded does not depend on the pixels
    _, params, part = make_workspace(tmp_path, mnist)  # the tiny setting as built for the other modules: no new build
    for cmd in (["git", "init", "-q"], ["git", "add", "params.yaml"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "baseline"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    raw = yaml.safe_load((tmp_path / "params.yaml").read_text())
    raw["fedcache"]["beta"] = 0.5
    raw["train"]["rounds"] = 1
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    changed_params = load_params("params.yaml")
    monkeypatch.setenv("DVC_EXP_NAME", "beta-half")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", rev)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    exp = experiments.current()
    assert exp == Experiment("beta-half", rev, tmp_path.resolve())
    assert experiments.changed_params(changed_params, exp) == {"train.rounds": 1, "fedcache.beta": 0.5}

    from test_results_index import _trainer

    summary = _trainer(changed_params, part, mnist, "local").run()
    with duckdb.connect(str(paths.run_results("local")), read_only=True) as con:
        row = con.execute("SELECT experiment, changed FROM runs WHERE run_id = ?", [summary["run_id"]]).fetchone()
    assert row[0] == "beta-half" and json.loads(row[1]) == {"train.rounds": 1, "fedcache.beta": 0.5}
    # outside an experiment: nothing recorded
    monkeypatch.delenv("DVC_EXP_NAME")
    assert experiments.current() is None and experiments.changed_params(changed_params, None) is None


STAGE = """
import sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():  # both processes start their run together
    time.sleep(0.01)
from flows.train import train_flow
train_flow(sys.argv[1])
"""

PUBLISH = """
import sys, time
from pathlib import Path
from pipeline.experiments.dvc import Experiment, publish
go = Path(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
publish(Experiment(sys.argv[1], None, Path(sys.argv[2])), Path("results/runs"))
"""


def _wait_all(procs, label):
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{label} failed:\n{out[-2000:]}\n{err[-3000:]}"


@pytest.mark.slow
def test_two_training_stages_and_two_publishers_at_once_lose_nothing(tmp_path, monkeypatch, mnist, prefect_api):
    """Two training stages (real flows, separate processes) write at the same moment, then two
    experiments publish into one main checkout at the same moment: every row of every run is in
    its own file and in the index, and no file holds another run's rows."""
    main = tmp_path / "main"
    main.mkdir()
    monkeypatch.chdir(main)
    make_workspace(main, mnist, {"train": {"rounds": 3, "algorithms": ["local", "fd"]}})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", STAGE, alg, str(go)], cwd=main, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for alg in ("local", "fd")]
    go.touch()
    _wait_all(procs, "a training stage")

    files = run_files(main / paths.RUNS)
    assert [f.parent.name for f in files] == ["fd", "local"]
    per_file = {}
    for f in files:
        with duckdb.connect(str(f), read_only=True) as con:
            runs = con.execute("SELECT run_id, algorithm, status FROM runs").fetchall()
            assert len(runs) == 1 and runs[0][1] == f.parent.name and runs[0][2] == "finished", runs
            for table in TABLES[1:]:  # every row of the file belongs to its one run
                assert con.execute(f"SELECT count(*) FROM {table} WHERE run_id <> ?", [runs[0][0]]).fetchone()[0] == 0
            assert [r[0] for r in con.execute("SELECT round FROM rounds ORDER BY round").fetchall()] == [0, 1, 2, 3]
            per_file[f.parent.name] = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}

    # two queued experiments (copies of this workspace) publish into the main checkout at once
    exps = []
    for name in ("exp-a", "exp-b"):
        exps.append(tmp_path / name)
        (tmp_path / name / "results").mkdir(parents=True)
        for f in files:
            dest = tmp_path / name / paths.RUNS / f.parent.name
            dest.mkdir(parents=True)
            # a run of its own: the same rows under another run id, as another experiment's run would have
            with duckdb.connect(str(f), read_only=True) as src, duckdb.connect(str(dest / paths.RUN_RESULTS)) as out:
                out.execute(f"ATTACH '{f}' AS src (READ_ONLY)")
                old = src.execute("SELECT run_id FROM runs").fetchone()[0]
                for table in TABLES:
                    out.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
                    out.execute(f"UPDATE {table} SET run_id = ?", [f"{old}-{name}"])
            (dest / "summary.json").write_text(json.dumps({"run_id": f"{old}-{name}"}))
    go2 = tmp_path / "go2"
    procs = [subprocess.Popen([sys.executable, "-c", PUBLISH, e.name, str(main), str(go2)], cwd=e, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for e in exps]
    go2.touch()
    _wait_all(procs, "a publisher")

    with duckdb.connect(str(main / paths.RESULTS_DB), read_only=True) as con:
        counts = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
        assert len(con.execute("SELECT run_id FROM runs").fetchall()) == 6  # 2 stages x (workspace + 2 experiments)
    assert counts == {t: 3 * sum(c[t] for c in per_file.values()) for t in TABLES}
    for e in exps:
        assert sorted(p.name for p in (main / experiments.EXPERIMENTS / e.name).iterdir()) == ["fd", "local"]
    # and the index is the same when rebuilt again from the files alone
    os.remove(main / paths.RESULTS_DB)
    assert rebuild_index(main / paths.RESULTS_DB).runs == 6


def test_the_seeds_sweep_repeats_the_configuration_with_three_seeds(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    planned = sweeps.plan("seeds", ["train.algorithms=[fedcache,fd]"])
    assert [(p.name, p.settings) for p in planned] == [
        (f"seeds-seed-{s}", {"seed": s, "train.algorithms": ["fedcache", "fd"]}) for s in (0, 1, 2)]
