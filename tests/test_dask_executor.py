"""The dask executor (`train.executor: dask`) computes what the sequential one does.

As in the conformance suite (tests/test_conformance.py), for every method in the registry: two
real runs of one round on the tiny MNIST setting at 14 x 14 pixels (3 uneven clients, batch 8, float64,
the method's `tiny_setting`) must give a byte-identical ledger, the same per-client accuracies and the
same checkpoint: every client's weights, optimizer and state, and the server half's state folded from
the uploads that came back. That is everything the next round starts from, so a later round on either
executor starts equal (tests/test_conformance.py checks that a run resumed from a checkpoint ends as
an uninterrupted one does). The dask runs join the multi-machine layout on one machine: a scheduler and 2
workers started here as separate processes on 127.0.0.1 (one set for the whole module: starting
workers takes seconds), through `train.dask_address`. The local cluster the executor starts
itself when no address is given is started, and stopped by a failing round, in its own test.
Whatever a test starts it stops, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import flows  # noqa: F401  (Prefect's offline-safe settings, as in a stage)
import numpy as np
import psutil
import pytest
import torch

from pipeline import paths
from pipeline.methods import registry
from pipeline.methods.registry import REGISTRY
from pipeline.config import ConfigError, parse_params
from pipeline.train.engine import Trainer
from pipeline.train.executors import SequentialExecutor
from pipeline.results.store import ResultsDB

from boundary import tally_the_boundary
from conftest import tiny, tiny_params_raw, with_section

DASK = Path(sys.executable).with_name("dask")


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests compare two computations, not accuracy."""
    return small_mnist


def _trainer(params, part, mnist, algorithm: str, executor: str, **train) -> Trainer:
    params = with_section(params, "train", executor=executor, **train)
    name = f"{algorithm}-{executor}"
    return Trainer(params, REGISTRY[algorithm], part, mnist, paths.RUNS / name, paths.CHECKPOINTS / f"{name}.pt",
                   ResultsDB(paths.RESULTS_DB))


def _train(trainer: Trainer, rounds: int = 2) -> list[tuple[int, float, int]]:
    trainer.start()
    for r in range(1, rounds + 1):
        trainer.run_round(r)
    return trainer.sim.evaluate(rounds)[0]


def _assert_same(got, want, where: str) -> None:
    """Nested dicts / lists of tensors and plain values: equal, tensors to float64's last digits."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, where
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-7, msg=lambda m: f"{where}: {m}")
    elif isinstance(want, np.ndarray):
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            _assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def _wait_until(condition, seconds: float, what: str, poll: float = 0.1) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f} s: {what}")
        time.sleep(poll)


@pytest.fixture(scope="module")
def joined(separate_cluster):
    """The dask executor joined to the module's scheduler and 2 workers (`train.dask_address`): one for the
    module, as starting workers takes seconds. The executor's own local cluster is started and stopped in
    test_a_failing_round_stops_the_local_cluster."""
    from pipeline.train.dask_executor import DaskExecutor

    executor = DaskExecutor(address=separate_cluster)
    try:
        executor.start()
        yield executor
    finally:
        executor.close()


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group (a `dask worker` is a nanny and its worker process), then SIGKILL."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


@pytest.fixture(scope="module")
def separate_cluster(tmp_path_factory, prefect_api):
    """`dask scheduler` and two `dask worker`s as separate processes on 127.0.0.1: what several machines
    run, on one. Yields the scheduler's address."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("dask-cluster")
    procs: list[subprocess.Popen] = []

    def spawn(name: str, *args: str) -> subprocess.Popen:
        log = open(tmp / f"{name}.log", "w")
        p = subprocess.Popen([str(DASK), *args], stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                             start_new_session=True)  # its own process group: stopped as one below
        log.close()
        procs.append(p)
        return p

    def logs() -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(tmp.glob("*.log")))

    try:
        info = tmp / "scheduler.json"
        scheduler = spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                          "--scheduler-file", str(info))
        def address() -> str | None:
            try:
                return json.loads(info.read_text()).get("address")
            except (OSError, ValueError):  # not written yet, or half written
                return None

        _wait_until(lambda: address() or scheduler.poll() is not None, 120, "the scheduler writes its address")
        assert scheduler.poll() is None, logs()
        for i in range(2):
            spawn(f"worker{i}", "worker", address(), "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
                  "--no-dashboard", "--name", f"worker{i}")
        with Client(address(), timeout=60) as client:
            try:
                client.wait_for_workers(2, timeout=180)
            except TimeoutError:
                raise AssertionError(f"the workers did not join:\n{logs()}") from None
        yield address()
    finally:
        _stop(procs)


CASES = registry.names()  # FedCache with its tiny setting's `round` consistency (`live` needs the server half)


@pytest.mark.slow  # end to end: Dask clusters of worker processes, task runs reported to the session's Prefect server
@pytest.mark.parametrize("algorithm", CASES)
def test_dask_equals_sequential(tiny_workspace, mnist, float64, separate_cluster, joined, algorithm):
    _, params, part = tiny_workspace
    params = tiny(params, algorithm)
    seq = _trainer(params, part, mnist, algorithm, "sequential")
    dask = _trainer(params, part, mnist, algorithm, "dask", dask_address=separate_cluster)
    assert type(dask.executor).__name__ == "DaskExecutor"
    dask.executor = joined  # the module's (this one has not joined yet)
    sizes = [c.num_train for c in seq.clients]
    assert len(set(sizes)) > 1 and any(n % 8 for n in sizes)  # uneven clients and partial batches are exercised

    crossed = tally_the_boundary(dask)
    rows_seq, rows_dask = _train(seq, rounds=1), _train(dask, rounds=1)

    assert seq.ledger.state_dict() == dask.ledger.state_dict()  # byte-identical ledger
    assert dask.ledger.total() == crossed["bytes"]  # every array that came back from the workers was counted
    assert [(k, n) for k, _, n in rows_seq] == [(k, n) for k, _, n in rows_dask]
    assert [a for _, a, _ in rows_seq] == pytest.approx([a for _, a, _ in rows_dask], abs=1e-12)
    for c_seq, c_dask in zip(seq.clients, dask.clients):
        assert all(p.dtype != torch.float32 for p in c_dask.model.state_dict().values())  # the workers trained in float64
    # everything a checkpoint holds, as the next round would start from it: every client's model, optimizer
    # (momentum came back) and state, and the server half's state folded from the uploads that came back
    state_seq, state_dask = seq._state(1), dask._state(1)
    for key in ("clients", "algorithm", "ledger", "history"):
        _assert_same(state_dask[key], state_seq[key], key)
    last = joined.last_round["clients"]
    assert sorted(last) == [0, 1, 2] and all(s["bytes_to"] > 0 and s["worker"].startswith("tcp://")
                                             for s in last.values())


@pytest.mark.slow
def test_separate_scheduler_and_workers(tiny_workspace, mnist, float64, separate_cluster):
    """The multi-machine layout on one machine: the executor joins a running scheduler (`train.dask_address`)."""
    _, params, part = tiny_workspace
    params = with_section(params, "fedcache", consistency="round")
    seq = _trainer(params, part, mnist, "fedcache", "sequential")
    dask = _trainer(params, part, mnist, "fedcache", "dask", dask_address=separate_cluster)
    try:
        rows_seq, rows_dask = _train(seq), _train(dask)
        workers = {s["worker"] for s in dask.executor.last_round["clients"].values()}
    finally:
        dask.close()
    assert seq.ledger.state_dict() == dask.ledger.state_dict()
    assert [a for _, a, _ in rows_seq] == pytest.approx([a for _, a, _ in rows_dask], abs=1e-12)
    for c_seq, c_dask in zip(seq.clients, dask.clients):
        for p, q in zip(c_seq.model.state_dict().values(), c_dask.model.state_dict().values()):
            assert p.dtype != torch.float32  # really in float64
            torch.testing.assert_close(q, p, atol=1e-9, rtol=1e-7)
    from distributed import Client

    with Client(separate_cluster, timeout=30) as client:  # leaving a running cluster does not stop it
        assert workers <= set(client.scheduler_info(n_workers=-1)["workers"])
        assert len(client.scheduler_info(n_workers=-1)["workers"]) == 2


@pytest.mark.slow
def test_a_failing_round_stops_the_local_cluster(tiny_workspace, mnist, prefect_api):
    """A client half that fails on a worker fails the run with its own error, and Trainer.run stops the
    cluster's worker processes on the way out (nothing is left running)."""
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "fedavg", "dask", dask_workers=1)
    trainer.executor.start()
    workers = list(trainer.executor._runner.client.run(os.getpid).values())
    assert len(workers) == 1 and os.getpid() not in workers  # a worker process, not a thread of this one
    trainer.server.configure = lambda round_, selected: {k: [] for k in selected}  # FedAvg's client needs its params
    with pytest.raises(ValueError, match="not enough values to unpack"):
        trainer.run()

    def gone() -> bool:
        return not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in workers)

    _wait_until(gone, 60, f"the cluster's worker processes {workers} end")
    assert trainer.executor._runner is None
    trainer.close()  # twice is fine


def test_live_consistency_falls_back_to_the_sequential_executor(tiny_workspace, mnist, capsys):
    _, params, part = tiny_workspace
    trainer = _trainer(with_section(params, "fedcache", consistency="live"), part, mnist, "fedcache", "dask")
    assert isinstance(trainer.executor, SequentialExecutor)
    assert "per-step exchange hook" in capsys.readouterr().out
    other = _trainer(with_section(params, "fedcache", consistency="live"), part, mnist, "fedavg", "dask")
    assert type(other.executor).__name__ == "DaskExecutor"  # the other methods still run on Dask (none started)
    assert other.executor._runner is None


def test_step_consistency_is_refused_with_dask():
    raw = tiny_params_raw({"fedcache": {"consistency": "step"}})
    raw["train"]["executor"] = "dask"
    with pytest.raises(ConfigError, match="fedcache.consistency.*train.executor"):
        parse_params(raw)


@pytest.mark.parametrize("train,match", [
    ({"dask_address": "10.0.0.5:8786"}, "train.dask_address.*tcp://"),
    ({"dask_address": "tcp://10.0.0.5:8786", "dask_workers": 2}, "dask_workers.*dask_address"),
    ({"dask_workers": 0}, "train.dask_workers"),
    ({"executor": "ray"}, "train.executor"),
])
def test_bad_dask_params(train, match):
    raw = tiny_params_raw()
    raw["train"].update({"executor": "dask", **train})
    with pytest.raises(ConfigError, match=match):
        parse_params(raw)


def test_an_unreachable_scheduler_is_a_clear_error():
    import socket

    import dask

    from pipeline.train.dask_executor import DaskExecutor

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    executor = DaskExecutor(address=f"tcp://127.0.0.1:{port}")
    with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}):  # refused at once; no need to wait longer
        with pytest.raises(ConfigError, match="train.dask_address: no Dask scheduler answers"):
            executor.start()
    assert executor._runner is None
