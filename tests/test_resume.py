"""Resume after a crash: a training stage killed mid-run and started again continues from its
last checkpointed round and ends with the same metrics as an uninterrupted run (CPU, same seed).
The rows live in the stage's own results file, which holds its current run only. The same under
the async schedule (pipeline/train/schedules/async_.py), whose event log must come out the same too."""

import os
import signal
import subprocess
import sys
import time

import duckdb
import pytest
import torch
import yaml

from pipeline import paths

pytestmark = pytest.mark.slow
ROUNDS = 6  # killed once round 3 is checkpointed: rounds 4-6 are left for the restart to redo


def _start(cwd):
    return subprocess.Popen([sys.executable, "-m", "flows.train", "fedcache"], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _checkpoint_round(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True)["round"]  # plain data only (pipeline/train/checkpoint.py)
    except Exception:  # not there yet
        return -1


def _stamp(path):
    """(modification time, size) of the file, None while it is not there: a new checkpoint changes it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


RESULTS = paths.run_results("fedcache")


def _metrics(run_id):
    con = duckdb.connect(str(RESULTS), read_only=True)
    try:
        rounds = con.execute("SELECT round, mean_acc, bytes_up, bytes_down, sim_time_s FROM rounds WHERE run_id = ? "
                             "ORDER BY round", [run_id]).fetchall()
        clients = con.execute("SELECT round, client_id, acc FROM client_rounds WHERE run_id = ? ORDER BY round, client_id",
                              [run_id]).fetchall()
        comm = con.execute("SELECT round, client_id, direction, kind, bytes, sim_time_s FROM comm WHERE run_id = ? "
                           "ORDER BY ALL", [run_id]).fetchall()
    finally:
        con.close()
    return rounds, clients, comm


def _run_ids():
    con = duckdb.connect(str(RESULTS), read_only=True)
    try:
        return con.execute("SELECT run_id, status FROM runs ORDER BY started_at").fetchall()
    finally:
        con.close()


# async: every client trains at its own device's pace, the checkpoint holds the event queue and the updates in
# flight (FedCache reads the cache when an update starts: consistency round)
ASYNC = {"train": {"schedule": "async"}, "devices": {"enabled": True}, "fedcache": {"consistency": "round"}}
EVENTS = paths.run_dir("fedcache") / "events.jsonl"


@pytest.mark.parametrize("schedule", ["sync", "async"])
def test_killed_run_resumes_to_the_same_metrics(tiny_workspace, prefect_api, schedule):
    cwd, _, _ = tiny_workspace
    raw = yaml.safe_load((cwd / "params.yaml").read_text())
    raw["train"]["rounds"] = ROUNDS
    raw["train"]["checkpoint_every"] = 1  # killed after round 3's checkpoint
    for section, values in (ASYNC if schedule == "async" else {}).items():
        raw[section].update(values)
    (cwd / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    # 1. the uninterrupted reference run
    ref = _start(cwd)
    assert ref.wait(timeout=300) == 0, ref.stdout.read()
    [(ref_id, ref_status)] = _run_ids()
    assert ref_status == "finished"
    ref_rounds, ref_clients, ref_comm = _metrics(ref_id)
    ref_events = EVENTS.read_text() if schedule == "async" else None

    # 2. the same run, killed (SIGKILL, no clean-up) once round 3 is checkpointed
    ckpt = paths.checkpoint_path("fedcache")
    proc = _start(cwd)
    deadline, seen = time.monotonic() + 300, None
    while True:  # read the checkpoint only when it was written again (a load at every poll slowed the run down)
        stamp = _stamp(ckpt)
        if stamp != seen and _checkpoint_round(ckpt) >= 3:
            break
        seen = stamp
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = _checkpoint_round(ckpt)
    assert 3 <= killed_at < ROUNDS
    [(crashed_id, status)] = _run_ids()  # the new run replaced the reference run's rows
    assert status == "running" and crashed_id != ref_id

    # 3. started again: continues from the checkpoint, same run id, and finishes
    again = _start(cwd)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    assert f"resuming run {crashed_id} at round {killed_at + 1}" in out
    assert _run_ids() == [(crashed_id, "finished")]
    assert not ckpt.exists()

    rounds, clients, comm = _metrics(crashed_id)
    assert [r[0] for r in rounds] == list(range(ROUNDS + 1))  # no round lost or written twice
    assert rounds == ref_rounds  # identical accuracies and bytes, round by round
    assert clients == ref_clients
    assert comm == ref_comm
    if schedule == "async":
        assert all(r[-1] is not None for r in rounds)
        assert len(ref_events.splitlines()) > ROUNDS and EVENTS.read_text() == ref_events  # the same event log
