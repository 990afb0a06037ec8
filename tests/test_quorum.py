"""The quorum schedule (pipeline/train/schedules/quorum.py): a round closes when ceil(train.quorum x its
participants) uploads have arrived; the later ones are dropped as stragglers. The schedule is one module; these
tests are its proof that a fourth schedule drives the same simulation as the others (issue 37)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest

from conftest import tiny_params_raw, with_section
from pipeline import paths
from pipeline.config import ConfigError, parse_params
from pipeline.federation.clock import ClientTime
from pipeline.methods.registry import REGISTRY
from pipeline.results.store import RunResultsDB
from pipeline.train.engine import Trainer
from pipeline.train.schedules.quorum import Quorum

DURATIONS = {0: ClientTime(0, 1.0, 0, 0), 1: ClientTime(0.5, 1.0, 0, 0.5), 2: ClientTime(0, 4.0, 0, 0)}  # 1, 2, 4 s


def _quorum(q: float, online_until: dict[int, float]) -> Quorum:
    """The schedule over a stand-in simulation: only its clock's online_until is read."""
    schedule = Quorum.__new__(Quorum)
    schedule.params = SimpleNamespace(train=SimpleNamespace(quorum=q))
    schedule.sim = SimpleNamespace(clock=SimpleNamespace(
        online_until=lambda start, times: {k: online_until.get(k, math.inf) for k in times}))
    return schedule


@pytest.mark.parametrize("q, online_until, close", [
    (1 / 3, {}, 11.0),  # one of three: the first arrival (client 0 at 1 s)
    (0.34, {}, 12.0),  # ceil(1.02) = 2: the second arrival; a rounding down would close at the first
    (2 / 3, {}, 12.0),
    (1.0, {}, 14.0),  # every upload: as late as sync
    (0.5, {0: 10.5}, 14.0),  # client 0 goes offline before its upload arrives: the 2nd arrival is client 2's
    (1.0, {0: 10.5}, None),  # too few can arrive: the round closes at its last event, as sync does
])
def test_the_round_closes_at_the_quorums_arrival(q, online_until, close):
    assert _quorum(q, online_until).deadline(10.0, DURATIONS) == (None if close is None else pytest.approx(close))


def test_quorum_params_are_checked_naming_the_key():
    def params(**train):  # FedCache (listed) reads the cache once per update under a quorum, as under a deadline
        return parse_params(tiny_params_raw({"train": train, "devices": {"enabled": True},
                                             "fedcache": {"consistency": "round"}}))

    with pytest.raises(ConfigError, match=r"train.schedule = 'quorum' needs train.quorum"):
        params(schedule="quorum")
    with pytest.raises(ConfigError, match=r"train.quorum = 0.8 is read only when train.schedule is quorum"):
        params(quorum=0.8)
    with pytest.raises(ConfigError, match=r"train.quorum"):
        params(schedule="quorum", quorum=1.5)
    with pytest.raises(ConfigError, match=r"train.schedule = 'quorum'.*devices.enabled: true"):
        parse_params(tiny_params_raw({"train": {"schedule": "quorum", "quorum": 0.5},
                                      "fedcache": {"consistency": "round"}}))
    assert params(schedule="quorum", quorum=0.5).train.quorum == 0.5


def _trace(tmp_path, part, slow: int) -> str:
    """Identical devices (10 ms a sample, 1,000 kbit/s), client `slow` at a tenth of both."""
    lines = ["client_id,computation,communication"] + [
        f"{k + 1},{100 if k == slow else 10},{100 if k == slow else 1000}" for k in range(part.num_clients)]
    path = tmp_path / "devices.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_quorum_round_keeps_the_first_uploads_and_drops_the_rest(tiny_workspace, mnist, tmp_path):
    """3 clients, one 10x slower, quorum 2 of 3: each round keeps the two fast uploads and closes at the second;
    the slow client downloaded and trained, but its upload is neither counted nor folded into the cache.
    Defects it catches: the deadline driver's quantile instead of the count (0.5 -> the median, not the 2nd
    arrival: the same here, so the quorum is 0.34, whose quantile would be far below the 2nd arrival), the
    slow upload counted, the round's length taken from the slowest client."""
    _, params, part = tiny_workspace
    slow = int(np.argmax(np.diff(part.train_offsets)))
    params = with_section(params, "devices", enabled=True, trace=_trace(tmp_path, part, slow),
                          server_samples_per_s=None)  # the devices' time alone
    params = with_section(params, "train", schedule="quorum", quorum=0.34)
    params = with_section(params, "fedcache", consistency="round")  # a per-step exchange is refused, as deadline's
    trainer = Trainer(params, REGISTRY["fedcache"], part, mnist, paths.RUNS / "quorum",
                      paths.CHECKPOINTS / "quorum.pt", RunResultsDB(paths.RUNS / "quorum" / "run.duckdb"),
                      [paths.PARTITION])
    trainer.run()
    with duckdb.connect(str(paths.RUNS / "quorum" / "run.duckdb"), read_only=True) as con:
        comm = con.execute("SELECT round, client_id, direction, kind FROM comm").fetchall()
        ends = [t for (t,) in con.execute("SELECT sim_time_s FROM rounds ORDER BY round").fetchall()]
    for rnd in (1, 2):
        sent = {(k, d, kind) for r, k, d, kind in comm if r == rnd}
        for k in range(part.num_clients):
            assert (k, "down", "knowledge") in sent
            assert ((k, "up", "logits") in sent) == (k != slow)
    ids = trainer.server.ctx.client_sample_ids
    assert (trainer.server.cache.updated_in[ids(slow)] == -1).all()
    plan = trainer.sim.last_plan
    assert plan.dropped == {slow: "deadline"} and sorted(plan.kept) == sorted(k for k in range(3) if k != slow)
    second = sorted(t.duration for t in plan.times.values())[1]
    assert ends[2] - ends[1] == pytest.approx(second)  # round 2 lasted until the second arrival
    assert plan.deadline - plan.start == pytest.approx(second)
