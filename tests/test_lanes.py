"""Lockstep groups side by side (pipeline/train/lanes.py): how a step's groups are split into lanes, and that a
FedCache `step` round in lanes computes what the groups stepped in turn compute (float64, so only summation
order can differ), with the groups really on worker threads of one torch thread each."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch
from conftest import with_section

from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.results.store import ResultsDB
from pipeline.train import executors
from pipeline.train.engine import Trainer
from pipeline.train.lanes import lockstep, split


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


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): a quarter of the convolution; this compares two computations."""
    return small_mnist


def _fedcache_step_round(params, part, mnist, side_by_side: bool, name: str, threads: int):
    """One round of FedCache `step` on three groups (heterogeneous: one architecture a client) with `threads` torch
    threads; what each group's steps ran on."""
    params = with_section(with_section(params, "train", threads=threads, executor="vectorized",
                                       side_by_side=side_by_side), "fedcache", consistency="step")
    trainer = Trainer(params, REGISTRY["fedcache"], part, mnist, paths.RUNS / name, paths.CHECKPOINTS / f"{name}.pt",
                      ResultsDB(paths.RESULTS_DB), hetero=True)
    seen: set[tuple[str, int]] = set()
    step = executors.GroupRun.step

    def watched(run, s):
        if run.active(s):
            seen.add((threading.current_thread().name.split("_")[0], torch.get_num_threads()))
        return step(run, s)

    executors.GroupRun.step = watched
    try:
        trainer.start()
        trainer.run_round(1)
    finally:
        executors.GroupRun.step = step
    return trainer, seen


def test_a_step_round_in_lanes_computes_what_the_groups_in_turn_compute(tiny_workspace, mnist, float64):
    _, params, part = tiny_workspace
    threads = torch.get_num_threads()
    # in turn on one thread (two only contend with the other test worker; the groups' arithmetic is the same)
    in_turn, turn_threads = _fedcache_step_round(params, part, mnist, False, "in-turn", threads=1)
    lanes, lane_threads = _fedcache_step_round(params, part, mnist, True, "lanes", threads=2)
    assert torch.get_num_threads() == 2  # the run's own count, given back after the lanes
    torch.set_num_threads(threads)

    assert turn_threads == {("MainThread", 1)}
    assert ("lane", 1) in lane_threads and all(n == 1 for name, n in lane_threads if name == "lane")
    assert len(in_turn.clients) == 3 and len({executors.architecture(c.model) for c in in_turn.clients}) == 3
    for a, b in zip(in_turn.clients, lanes.clients):
        for (name, pa), (_, pb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
            torch.testing.assert_close(pb, pa, rtol=1e-9, atol=1e-11, msg=lambda m: f"client {a.id} {name}: {m}")
    cache_a, cache_b = in_turn.server.cache, lanes.server.cache
    torch.testing.assert_close(cache_b.logits, cache_a.logits, rtol=1e-9, atol=1e-11)
    assert torch.equal(cache_b.updated_in, cache_a.updated_in)
    assert lanes.ledger.rows(1) == in_turn.ledger.rows(1)
