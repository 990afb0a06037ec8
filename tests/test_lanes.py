"""Groups side by side (pipeline/train/lanes.py): how a step's groups are split into lanes, how groups that train
their rounds alone share the lanes, and that a FedCache round in lanes computes what the groups in turn compute
(float64, so only summation order can differ), with the groups really on worker threads of one torch thread each:
in `step` consistency (lockstep) and in `round` (each group's round alone, at most one a lane alive); no grouped
step leaves its gradients behind."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from conftest import with_section

from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.results.store import ResultsDB
from pipeline.train import executors
from pipeline.train.engine import Trainer
from pipeline.train.lanes import each_alone, lockstep, split


@dataclass
class FakeGroup:
    name: str
    clients: int
    per_client: int
    steps: int

    def active(self, s: int) -> int:
        return self.clients if s < self.steps else 0

    def cost(self) -> int:
        return self.per_client

    def step(self, s: int) -> None:
        pass


def test_split_balances_the_work_of_the_groups_that_take_the_step():
    r8, r16, r20 = FakeGroup("r8", 7, 1, 10), FakeGroup("r16", 7, 2, 5), FakeGroup("r20", 6, 3, 3)
    assert split([r8, r16, r20], 0, 2) == [[r20], [r8, r16]]  # 18 against 7 + 14
    assert split([r8, r16, r20], 4, 2) == [[r16], [r8]]  # r20 has finished
    assert split([r8, r16, r20], 7, 2) == [[r8]]  # one group left: one lane
    assert split([r8, r16, r20], 0, 1) == [[r8, r16, r20]]  # one lane: in turn, in order
    assert split([r8, r16, r20], 10, 2) == []


def test_a_lanes_error_is_raised_to_the_caller():
    class Broken(FakeGroup):
        def step(self, s: int) -> None:
            raise RuntimeError("lane broke")

    with lockstep(2) as step, pytest.raises(RuntimeError, match="lane broke"):
        step([FakeGroup("a", 1, 1, 1), Broken("b", 1, 1, 1)], 0)


def test_jobs_alone_run_at_most_one_a_lane_the_costliest_first_and_each_result_comes_back():
    started, running, most = [], [0], [0]
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=120)  # the first two jobs meet here: they ran at once (a failure waits 120 s)

    def job(name: str):
        def run():
            with lock:
                started.append(name)
                running[0] += 1
                most[0] = max(most[0], running[0])
            if name in ("big", "mid"):
                both.wait()
            with lock:
                running[0] -= 1
            return name, threading.current_thread().name.split("_")[0], torch.get_num_threads()
        return run

    names = ["small", "big", "tiny", "mid"]
    out = list(each_alone([job(n) for n in names], [2, 9, 1, 5], lanes=2))
    assert sorted(name for name, _, _ in out) == sorted(names)
    assert started[:2] in (["big", "mid"], ["mid", "big"]) and started[2:] == ["small", "tiny"]
    assert most[0] == 2 and {(t, n) for _, t, n in out} == {("lane", 1)}
    # one lane: in turn on the caller's thread, in the order given, with its own thread count
    alone = list(each_alone([job(n) for n in ["tiny", "small"]], [1, 2], lanes=1))
    assert [(name, t) for name, t, _ in alone] == [("tiny", "MainThread"), ("small", "MainThread")]


def test_a_jobs_error_is_raised_to_the_caller():
    def broken():
        raise RuntimeError("job broke")

    with pytest.raises(RuntimeError, match="job broke"):
        list(each_alone([lambda: 1, broken], [1, 1], lanes=2))


def test_groups_without_an_exchange_go_side_by_side_only_where_their_architectures_differ():
    def group(width: int) -> list:
        return [SimpleNamespace(model=torch.nn.Linear(4, width), x_train=torch.zeros(1, 4))]

    one_arch, two_archs = [group(2), group(2), group(2)], [group(2), group(3), group(3)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lanes = executors.VectorizedExecutor(32).lanes
        assert lanes(two_archs, uses_exchange=False) == 2 and lanes(one_arch, uses_exchange=False) == 1
        assert lanes(one_arch, uses_exchange=True) == 2  # lockstep: in lanes whatever the architectures
        assert lanes(two_archs[:1], uses_exchange=True) == 1
        assert executors.VectorizedExecutor(32, side_by_side=False).lanes(two_archs, uses_exchange=True) == 1
        torch.set_num_threads(1)
        assert lanes(two_archs, uses_exchange=False) == 1
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): a quarter of the convolution; this compares two computations."""
    return small_mnist


def _fedcache_round(params, part, mnist, consistency: str, side_by_side: bool, name: str, threads: int):
    """One round of FedCache in `consistency` on three groups (heterogeneous: one architecture a client) with
    `threads` torch threads; what each group's steps ran on, and the most grouped networks alive at once."""
    params = with_section(with_section(params, "train", threads=threads, executor="vectorized",
                                       side_by_side=side_by_side), "fedcache", consistency=consistency)
    trainer = Trainer(params, REGISTRY["fedcache"], part, mnist, paths.RUNS / name, paths.CHECKPOINTS / f"{name}.pt",
                      ResultsDB(paths.RESULTS_DB), hetero=True)
    seen: set[tuple[str, int]] = set()
    alive, most, kept_gradients = [0], [0], [False]
    lock = threading.Lock()
    init, step, finish = executors.GroupRun.__init__, executors.GroupRun.step, executors.GroupRun.finish

    def watched_init(run, *args, **kwargs):
        init(run, *args, **kwargs)
        with lock:
            alive[0] += 1
            most[0] = max(most[0], alive[0])

    def watched(run, s):
        if run.active(s):
            with lock:
                seen.add((threading.current_thread().name.split("_")[0], torch.get_num_threads()))
        out = step(run, s)
        if any(p.grad is not None for _, p in run.model.named_grouped_parameters()):
            kept_gradients[0] = True  # a group waiting for the others' steps would hold them
        return out

    def watched_finish(run):
        with lock:
            alive[0] -= 1
        return finish(run)

    executors.GroupRun.__init__, executors.GroupRun.step, executors.GroupRun.finish = (
        watched_init, watched, watched_finish)
    try:
        trainer.start()
        trainer.run_round(1)
    finally:
        executors.GroupRun.__init__, executors.GroupRun.step, executors.GroupRun.finish = init, step, finish
    assert not kept_gradients[0], "a grouped step left its gradients behind"
    return trainer, seen, most[0]


@pytest.mark.parametrize("consistency", ["step", "round"])
def test_a_round_in_lanes_computes_what_the_groups_in_turn_compute(tiny_workspace, mnist, float64, consistency):
    _, params, part = tiny_workspace
    threads = torch.get_num_threads()
    # in turn on one thread (two only contend with the other test worker; the groups' arithmetic is the same)
    in_turn, turn_threads, turn_alive = _fedcache_round(params, part, mnist, consistency, False,
                                                        f"in-turn-{consistency}", threads=1)
    lanes, lane_threads, lanes_alive = _fedcache_round(params, part, mnist, consistency, True,
                                                       f"lanes-{consistency}", threads=2)
    assert torch.get_num_threads() == 2  # the run's own count, given back after the lanes
    torch.set_num_threads(threads)

    assert turn_threads == {("MainThread", 1)}
    assert ("lane", 1) in lane_threads and all(n == 1 for name, n in lane_threads if name == "lane")
    if consistency == "step":  # lockstep: every group's network alive for the round
        assert (turn_alive, lanes_alive) == (3, 3)
    else:  # each group's round alone: one network alive in turn, at most one a lane side by side, steps on lanes
        assert turn_alive == 1 and lanes_alive <= 2 and {name for name, _ in lane_threads} == {"lane"}
    assert len(in_turn.clients) == 3 and len({executors.architecture(c.model) for c in in_turn.clients}) == 3
    for a, b in zip(in_turn.clients, lanes.clients):
        for (name, pa), (_, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
            torch.testing.assert_close(pb, pa, rtol=1e-9, atol=1e-11, msg=lambda m: f"client {a.id} {name}: {m}")
    cache_a, cache_b = in_turn.server.cache, lanes.server.cache
    torch.testing.assert_close(cache_b.logits, cache_a.logits, rtol=1e-9, atol=1e-11)
    assert torch.equal(cache_b.updated_in, cache_a.updated_in)
    assert lanes.ledger.rows(1) == in_turn.ledger.rows(1)
