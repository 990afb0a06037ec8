"""Groups side by side: lanes, one worker thread and one torch thread each.

At batch 8 a client one grouped step does not keep two cores busy, so several groups at once, each on one core,
do more (bench/threads_per_group.py). Two ways to share the lanes:

  lockstep     when a method exchanges every step (FedCache's `step` consistency): group 1's step s, group 2's
               step s, ..., then the server's end of step s, each step's groups split into lanes of similar
               work. The result does not depend on the order the groups take within a step: each reads the
               server as the previous step left it, and what it uploads lands at the end of the step; the
               engine's ledger counts bytes by client. A step with one group left runs it on the caller's thread
               with all its torch threads, as in turn.
  each_alone   otherwise: each group's whole round is one job, and the lanes take the jobs one at a time, the
               costliest first, so at most one grouped network a lane is alive.

The exchanges themselves are taken one at a time (a lock, `serialized`): the server half and the engine's
bookkeeping are not written for threads. Each lane runs on one torch thread, so a group's arithmetic does not
depend on which lane or thread ran it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Protocol, TypeVar

import torch

T = TypeVar("T")


class Steppable(Protocol):
    def active(self, s: int) -> int: ...  # clients that take step s (0: none)

    def cost(self) -> int: ...  # work of one client's step, in any unit the groups share

    def step(self, s: int) -> None: ...


def split(groups: Sequence[Steppable], s: int, lanes: int) -> list[list[Steppable]]:
    """The groups that take step s, in lanes of similar work (largest first into the least loaded lane); a
    lane keeps the groups' order."""
    live = [g for g in groups if g.active(s)]
    load = [0] * lanes
    into: dict[int, int] = {}
    for i in sorted(range(len(live)), key=lambda i: -live[i].active(s) * live[i].cost()):
        lane = min(range(lanes), key=lambda k: load[k])
        into[i] = lane
        load[lane] += live[i].active(s) * live[i].cost()
    return [lane for lane in ([g for i, g in enumerate(live) if into[i] == k] for k in range(lanes)) if lane]


def serialized(call: Callable) -> Callable:
    """The same call, one caller at a time."""
    lock = threading.Lock()

    def one_at_a_time(*args, **kwargs):
        with lock:
            return call(*args, **kwargs)

    return one_at_a_time


@contextmanager
def lockstep(lanes: int) -> Iterator[Callable[[Sequence[Steppable], int], None]]:
    """step(groups, s): every group's step s, on `lanes` worker threads when more than one group takes it."""

    def run_lane(lane: Sequence[Steppable], s: int) -> None:
        for group in lane:
            group.step(s)

    if lanes == 1:  # in turn on this thread: no pool, no split
        yield run_lane
        return
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(lanes, thread_name_prefix="lane", initializer=torch.set_num_threads, initargs=(1,))

    def step(groups: Sequence[Steppable], s: int) -> None:
        work = split(groups, s, lanes)
        if len(work) == 1:
            run_lane(work[0], s)  # alone: on this thread, with all its torch threads
            return
        for future in [pool.submit(run_lane, lane, s) for lane in work]:
            future.result()  # a lane's error is raised here

    try:
        yield step
    finally:
        pool.shutdown(wait=True)
        # torch.set_num_threads also sets the count threads started later begin with: this thread's count again
        torch.set_num_threads(threads)


def each_alone(jobs: Sequence[Callable[[], T]], cost: Sequence[int], lanes: int) -> Iterator[T]:
    """Independent jobs (a group's whole round each), at most `lanes` at once on worker threads of one torch
    thread each, the costliest first; yields each job's result as it finishes. One lane: in turn on this thread,
    in the order given (as the executor ran its groups before lanes)."""
    if lanes == 1 or len(jobs) == 1:
        for job in jobs:
            yield job()
        return
    order = sorted(range(len(jobs)), key=lambda i: -cost[i])
    threads = torch.get_num_threads()
    pool = ThreadPoolExecutor(lanes, thread_name_prefix="lane", initializer=torch.set_num_threads, initargs=(1,))
    try:
        futures = [pool.submit(jobs[i]) for i in order]  # the pool takes them in this order, one a free lane
        for future in as_completed(futures):
            yield future.result()  # a job's error is raised here
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)
