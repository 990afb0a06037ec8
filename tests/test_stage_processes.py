"""A stage that dies, however it dies, leaves no process of its own behind (flows/api.py).

Prefect's own ephemeral API server is a plain child of the stage: killed with SIGKILL (what the
OOM killer does), the stage used to leave it running, port held. The stages now use a server that
follows its owner: the `dvc` process running them (one server for a whole `dvc repro`), or the
stage itself when it runs by hand.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import seed_prefect_db
from flows import api
from flows.api import _free_port
from pipeline import paths

pytestmark = pytest.mark.slow


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of every process below `pid` now."""
    children, found, todo = _children(), {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            started = api.start_time(child)
            if started is not None:
                found[child] = started
                todo.append(child)
    return found


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for: {what}"
        time.sleep(0.05)


def test_a_stage_killed_with_sigkill_leaves_no_process_behind(tiny_workspace):
    cwd, _, _ = tiny_workspace
    raw = yaml.safe_load((cwd / "params.yaml").read_text())
    raw["train"]["rounds"] = 1000  # still training when it is killed
    (cwd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # as from a plain shell: it starts its own
    stage = subprocess.Popen([sys.executable, "-m", "flows.train", "local"], cwd=cwd, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)  # its own group: the test kills the stage's process alone
    try:
        ckpt = paths.checkpoint_path("local")
        wait_for(lambda: stage.poll() is not None or ckpt.exists(), 300, "the stage's first round")
        assert stage.poll() is None, "the stage ended before it could be killed"
        started = descendants(stage.pid)
        assert started, "the stage started no server"  # its Prefect API server, reporting the rounds
        record = Path(os.environ["PREFECT_HOME"]) / "stage-servers" / f"{stage.pid}-{api.start_time(stage.pid)}.json"
        assert record.is_file()
        os.kill(stage.pid, signal.SIGKILL)  # the stage alone, as the OOM killer does
        stage.wait()
        wait_for(lambda: not any(api.alive(pid, t) for pid, t in started.items()), 60,
                 f"the processes the stage started to exit: {started}")
        assert not record.exists()  # its server's record went with it
    finally:
        if stage.poll() is None:
            os.killpg(stage.pid, signal.SIGKILL)
            stage.wait()


def test_the_owner_is_the_nearest_dvc_process(tmp_path):
    """The stages of one `dvc repro` share a server: it belongs to the dvc process above them."""
    fake_dvc = tmp_path / "dvc"  # a program named dvc, running a stage-like child (not by exec: it stays the parent)
    fake_dvc.write_text(f"#!/bin/sh\necho $$\n{sys.executable} -c 'from flows.api import owner_pid; print(owner_pid())'\n"
                        "true\n")
    fake_dvc.chmod(0o755)
    out = subprocess.run([str(fake_dvc)], cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == out[1]
    by_hand = subprocess.run([sys.executable, "-c", "import os; from flows.api import owner_pid; "
                              "print(owner_pid() == os.getpid())"], cwd=Path(__file__).resolve().parent.parent,
                             capture_output=True, text=True, check=True).stdout.strip()
    assert by_hand == "True"


def test_a_stage_by_hand_starts_its_server_before_its_imports_and_it_ends_with_the_stage(tiny_workspace):
    """The server is started as the stage starts (flows/__init__.py), not once its imports are made: a stage whose
    params are refused (after its imports, before its flow would wait for the server) has started one all the same,
    named by its record, and that server exits and removes its record once the stage has exited."""
    cwd, _, _ = tiny_workspace
    raw = yaml.safe_load((cwd / "params.yaml").read_text())
    raw["train"]["lr"] = -1.0  # refused by the params' check, which runs before ensure_api()
    (cwd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # as from a plain shell
    registry = Path(os.environ["PREFECT_HOME"]) / "stage-servers"
    stage = subprocess.Popen([sys.executable, "-m", "flows.train", "local"], cwd=cwd, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        started = api.start_time(stage.pid)
        record = registry / f"{stage.pid}-{started}.json"
        wait_for(lambda: record.is_file() or stage.poll() is not None, 60, "the stage's server record")
        assert record.is_file(), "the stage ended without having started a server"
        server = json.loads(record.read_text())
        _, err = stage.communicate(timeout=120)
        assert stage.returncode == 2 and "train.lr" in err, err  # refused, naming the key
        wait_for(lambda: not api.alive(server["pid"], server["pid_start"]), 60, "the stage's server to exit")
        wait_for(lambda: not record.exists(), 10, "the server's record to go")
    finally:
        if stage.poll() is None:
            os.killpg(stage.pid, signal.SIGKILL)
            stage.wait()


def test_a_stage_server_registers_no_block_types(tmp_path, prefect_api):  # prefect_api: the database to seed from
    """A stage's server skips Prefect's block registration at its start (flows/api.py: STAGE_SERVER_SETTINGS): the
    stages use no blocks. Prefect writes memo_store.toml in PREFECT_HOME when it registers them (or checks whether it
    must); a stage server started on a fresh PREFECT_HOME (its database migrated, as the tests' copies have) leaves
    none."""
    home = tmp_path / "prefect-home"
    seed_prefect_db(home)
    owner = subprocess.Popen(["sleep", "600"])
    port, record = _free_port(), home / "server.json"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(home)}
    server = subprocess.Popen([sys.executable, "-m", "flows.api", "--owner", str(owner.pid), "--port", str(port),
                               "--record", str(record)], cwd=Path(__file__).resolve().parent.parent, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: api._healthy(f"http://127.0.0.1:{port}/api") or server.poll() is not None, 180,
                 "the server to answer")
        assert server.poll() is None, "the server exited"
        assert (home / "prefect.db").is_file() and not (home / "memo_store.toml").exists()
    finally:
        owner.kill()
        owner.wait()
        server.wait(timeout=60)  # it follows its owner out
