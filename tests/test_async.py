"""The asynchronous schedule (issue 24): `train.schedule: async` (pipeline/train/schedules/async_.py).

Pure checks first (FedAsync's weight on a hand case in float64, a buffer of B folding every B arrivals, the
refusals naming their keys), then tiny real runs (3 MNIST clients of 30 samples, the devices of a CSV trace):
a client 10x slower leaves the others' update instants unchanged (a sync round it makes 10x longer:
tests/test_clock.py); every download and upload of the event log is in the ledger; the same seeds give the
same event log and rows; a run resumed from a checkpoint ends where an uninterrupted one does (killed by
SIGKILL: tests/test_resume.py).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import torch

from conftest import unit_tier_first, with_section
from pipeline import paths
from pipeline.config import ConfigError, parse_params
from pipeline.federation.averaging import ParameterAveraging, mix, staleness_weight
from pipeline.federation.contract import ServerContext, Upload
from pipeline.federation.ledger import Payload
from pipeline.train.schedules.async_ import EVENTS_FILE, RANK
from test_clock import _rows, _run, _trace, _trainer, going_offline, metrics


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these runs check the schedule's bookkeeping, not learning."""
    return small_mnist


# ------------------------------------------------------------------------------------------ FedAsync, pure


def test_fedasync_mixes_an_upload_in_with_its_staleness_weight_on_a_hand_case():
    assert staleness_weight(0, 0.6, 0.5) == 0.6
    assert staleness_weight(3, 0.6, 0.5) == 0.6 * 4 ** -0.5 == 0.3  # alpha * (1 + 3)^(-1/2)
    assert staleness_weight(7, 0.5, 1.0) == 0.0625 and staleness_weight(9, 0.8, 0.0) == 0.8
    g = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64), "n": torch.tensor(10)}  # n: an integer buffer
    up = {"w": torch.tensor([3.0, 6.0], dtype=torch.float64), "n": torch.tensor(20)}
    out = mix(g, [up], [0.3])
    assert out["w"].tolist() == [1.0 * 0.7 + 3.0 * 0.3, -2.0 * 0.7 + 6.0 * 0.3]  # (1 - w) global + w upload
    assert out["w"].dtype == torch.float64 and out["n"].item() == 13 and out["n"].dtype == torch.int64


def _server(default_params_raw, tmp_path, buffer: int) -> ParameterAveraging:
    raw = default_params_raw
    raw["train"].update(schedule="async", async_buffer=buffer, async_alpha=0.6, async_staleness_exponent=0.5,
                        algorithms=["fedavg"])  # (a method listed without an asynchronous form is refused at load)
    raw["devices"]["enabled"] = True
    ctx = ServerContext(parse_params(raw), 3, 10, (1, 28, 28), None, torch.device("cpu"), tmp_path)
    return ParameterAveraging(ctx, {"w": torch.tensor([0.0], dtype=torch.float64)})


def _arrive(server, k: int, value: float) -> None:
    server.arrive(1, k, Upload([Payload("params", {"w": torch.tensor([value], dtype=torch.float64)})]))


def test_fedasync_alone_folds_every_arrival_counting_staleness_in_folds(default_params_raw, tmp_path):
    server = _server(default_params_raw, tmp_path, buffer=1)
    server.configure(1, [0, 1])  # both download version 0
    _arrive(server, 0, 1.0)  # staleness 0: weight 0.6
    assert server.version == 1 and server.global_state["w"].item() == 0.6
    _arrive(server, 1, 2.0)  # one fold since its download: weight 0.6 / sqrt(2)
    w = 0.6 * 2 ** -0.5
    assert server.version == 2 and server.global_state["w"].item() == 0.6 * (1 - w) + 2.0 * w


def test_a_buffer_of_b_folds_every_b_arrivals(default_params_raw, tmp_path):
    server = _server(default_params_raw, tmp_path, buffer=2)
    server.configure(1, [0, 1, 2])
    _arrive(server, 0, 1.0)
    assert server.version == 0 and server.global_state["w"].item() == 0.0  # held: 1 of 2
    _arrive(server, 1, 2.0)  # the second: both folded, each weighted 0.6 / 2
    assert server.version == 1 and server.global_state["w"].item() == 0.0 * 0.4 + (1.0 * 0.3 + 2.0 * 0.3)
    first = server.global_state["w"].item()
    server.configure(1, [0])  # client 0 downloads version 1
    _arrive(server, 2, 4.0)  # downloaded version 0: staleness 1
    assert server.version == 1  # held
    _arrive(server, 0, 8.0)  # staleness 0
    w2, w0 = 0.6 * 2 ** -0.5 / 2, 0.6 / 2
    assert server.version == 2
    assert server.global_state["w"].item() == first * (1 - (w2 + w0)) + (4.0 * w2 + 8.0 * w0)
    state = server.state_dict()  # the buffer, versions and downloads travel in the checkpoint
    assert state["async"]["version"] == 2 and state["async"]["buffer"] == [] and state["async"]["sent_version"] == {}


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("sections, fragments", [
    ({"train": {"schedule": "async"}}, ["train.schedule = 'async'", "devices.enabled: true"]),
    ({"train": {"schedule": "async", "participation": 0.5}, "devices": {"enabled": True}},
     ["train.participation = 0.5", "train.schedule = 'async'", "train.participation: 1.0"]),
    ({"train": {"async_eval_s": 10.0}}, ["train.async_eval_s = 10.0", "only when train.schedule is async"]),
    ({"train": {"schedule": "async", "async_eval_s": 0}, "devices": {"enabled": True}},
     ["train.async_eval_s = 0", "greater than 0"]),
    ({"train": {"schedule": "async", "async_alpha": 1.5}, "devices": {"enabled": True}}, ["train.async_alpha = 1.5"]),
    ({"train": {"schedule": "async", "async_buffer": 0}, "devices": {"enabled": True}}, ["train.async_buffer = 0"]),
    ({"train": {"schedule": "async"}, "devices": {"enabled": True}, "fedcache": {"consistency": "live"}},
     ["train.schedule = 'async'", "fedcache.consistency = 'live'", "fedcache.consistency: round"]),
])
def test_bad_async_params_are_refused_naming_the_key(default_params_raw, sections, fragments):
    for name, values in sections.items():
        default_params_raw[name].update(values)
    with pytest.raises(ConfigError) as err:
        parse_params(default_params_raw, "my-params.yaml")
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def _async(params, **train):
    params = with_section(params, "devices", enabled=True)
    return with_section(params, "train", schedule="async", **train)


@pytest.mark.parametrize("method", ["pfedme", "fedalt", "pdfl"])
def test_a_method_without_an_async_form_is_refused_before_any_work(tiny_workspace, mnist, method):
    _, params, part = tiny_workspace
    with pytest.raises(ConfigError, match=rf"train.schedule = 'async' cannot run {method}: .*train.schedule: sync"):
        _trainer(_async(params), part, mnist, "refused", method)
    assert not (paths.RUNS / "refused").exists()


# ------------------------------------------------------------------------------------------ tiny real runs


def _events(run: str) -> list[dict]:
    return [json.loads(line) for line in (paths.RUNS / run / EVENTS_FILE).read_text().splitlines()]


def _starts(events: list[dict], k: int) -> list[float]:
    return [e["t"] for e in events if e["client"] == k and e["event"] == "start"]


def _on_trace(params, tmp_path, part, slow=None, name="even.csv", **train):
    """Async on a trace of equal devices (client `slow` at a tenth of the speed and bandwidth); FedCache's
    cache read at each update's start."""
    params = with_section(params, "devices", trace=_trace(tmp_path, part, slow, name))
    return with_section(_async(params, **train), "fedcache", consistency="round")


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_a_client_ten_times_slower_leaves_the_others_cadence_unchanged(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    slow = 0
    _, even = _run(_on_trace(params, tmp_path, part, async_eval_s=2.0), part, mnist, "even")
    trainer, one_slow = _run(_on_trace(params, tmp_path, part, slow, "slow.csv", async_eval_s=2.0), part, mnist,
                             "slow")
    a, b = _events("even"), _events("slow")
    # span 1 starts when the set-up is done: FedCache's one barrier (the server's index needs every client's
    # hash codes), which the slow client's upload makes later; from then on, nobody waits for it
    ta, tb = even["rounds"][0][-1], one_slow["rounds"][0][-1]
    assert tb > ta
    for k in range(part.num_clients):
        if k != slow:
            assert len(_starts(a, k)) >= 3  # a few updates each within the 2 spans
            assert [t - tb for t in _starts(b, k)] == pytest.approx([t - ta for t in _starts(a, k)], abs=1e-9)
    # the slow client's own update takes 10x as long: its first download (a tenth of the bandwidth) ends 10x later
    downloaded = lambda events: next(e["t"] for e in events if e["client"] == slow and e["event"] == "downloaded")  # noqa: E731
    assert downloaded(b) - tb == pytest.approx(10 * (downloaded(a) - ta), rel=1e-9)
    assert [r[-1] for r in one_slow["rounds"][1:]] == pytest.approx([tb + 2.0, tb + 4.0], rel=1e-12)  # fixed spans
    assert trainer.summary()["async_eval_s"] == 2.0


def test_every_download_and_upload_of_the_event_log_is_in_the_ledger(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    _, rows = _run(_on_trace(params, tmp_path, part), part, mnist, "ledger")  # async_eval_s derived
    events = _events("ledger")
    C = 10
    for (span, k, event), count in Counter((e["span"], e["client"], e["event"]) for e in events).items():
        n = int(part.train_offsets[k + 1] - part.train_offsets[k])
        if event == "downloaded":  # every sample's teacher, float32
            [row] = [r for r in rows["comm"] if r[:4] == (span, k, "down", "knowledge")]
            assert row[4] == count * n * 4 * C
            assert row[6] == max(e["t"] for e in events if (e["span"], e["client"], e["event"]) == (span, k, event))
        if event == "arrived":  # every sample's id (int64) and logits (float32)
            [row] = [r for r in rows["comm"] if r[:4] == (span, k, "up", "logits")]
            assert row[4] == count * n * (8 + 4 * C)
    counted = Counter((r[0], r[1], r[2]) for r in rows["comm"] if r[0] > 0)
    logged = Counter((e["span"], e["client"], {"downloaded": "down", "arrived": "up"}[e["event"]]) for e in events
                     if e["event"] in ("downloaded", "arrived"))
    assert set(counted) == set(logged)  # no row without its event, no event without its row
    # the queue's order: by instant, then arrivals, downloads, training, starts, then client id
    keys = [(e["t"], RANK[e["event"]], e["client"]) for e in events]
    assert keys == sorted(keys) and [e["client"] for e in events[:3]] == [0, 1, 2]  # all start at once, by id
    assert len(rows["rounds"]) == 3 and all(r[1] is not None for r in rows["rounds"])


# a span of about 1.5 updates of the median client (a ResNet-8 weighs 0.3 MB: 2.4 s each way at 1 Mbit/s);
# flaky: devices online and offline for 1 s on average, so some updates are dropped and some starts wait
# FedCache's in the unit tier; the others' (two whole runs each) in the end-to-end tier
@pytest.mark.parametrize("method, span_s, flaky", unit_tier_first([
    ("fedcache", 1.5, False), ("fedcache", 1.5, True),
    ("fedavg", 8.0, False), ("mtfl", 8.0, False), ("fd", 1.5, False), ("local", 1.5, False)], keep=2))
def test_the_same_seeds_give_the_same_event_log_and_rows(tiny_workspace, mnist, tmp_path, method, span_s, flaky):
    _, params, part = tiny_workspace
    params = _on_trace(params, tmp_path, part, slow=1, async_eval_s=span_s)
    if flaky:
        params = with_section(params, "devices", online_mean_s=1.0, offline_mean_s=1.0)
    _, first = _run(params, part, mnist, "first", method)
    _, second = _run(params, part, mnist, "second", method)
    events = _events("first")
    assert events == _events("second") and len(events) > 10
    assert first == second
    assert flaky == any(e["event"] == "dropped" for e in events)  # dropped only when devices go offline


def test_the_busy_seconds_are_the_updates_that_arrived_or_are_under_way(tiny_workspace, mnist, tmp_path):
    """The waiting share under async (docs/devices.md), checked against the event log: a client is busy from an
    update's start to its arrival (or to the last span's end while under way); a dropped update is waiting."""
    _, params, part = tiny_workspace
    params = with_section(_on_trace(params, tmp_path, part, slow=1, async_eval_s=1.5), "devices",
                          online_mean_s=1.0, offline_mean_s=1.0)
    _, rows = _run(params, part, mnist, "busy")
    events = _events("busy")
    end = rows["rounds"][-1][-1]
    busy, since = 0.0, {}
    for e in events:
        if e["event"] == "start":
            since[e["client"]] = e["t"]
        elif e["event"] == "arrived":
            busy += e["t"] - since.pop(e["client"])
        elif e["event"] == "dropped":
            since.pop(e["client"])
    busy += sum(end - t for t in since.values())
    waiting = metrics("busy")
    assert any(e["event"] == "dropped" for e in events)
    assert sum(waiting["sim_busy_s"]) == pytest.approx(busy, rel=1e-9)
    assert waiting["sim_client_s"] == pytest.approx([part.num_clients * 1.5] * 2)
    assert 0 < busy < sum(waiting["sim_client_s"])


def test_a_download_cut_short_by_the_connection_dropping_is_neither_counted_nor_trained_on(tiny_workspace, mnist,
                                                                                           tmp_path):
    """Issue 36: FedAvg on equal devices (a download takes 2.45 s, from 0 s); client 2 goes offline at 1 s, during
    its first download, until 6 s. It never got that download: no row counts it, it does not train (its model is
    as it started when the run ends at 8 s, its next download still under way), and the update is dropped at 1 s;
    it starts again when it is back online."""
    _, params, part = tiny_workspace
    trainer = _trainer(_on_trace(params, tmp_path, part, async_eval_s=4.0), part, mnist, "cut", "fedavg")
    going_offline(trainer, 2, 1.0, 6.0)
    before = {n: t.clone() for n, t in trainer.clients[2].model.state_dict().items()}
    trainer.run()
    events, rows = _events("cut"), _rows("cut")
    assert [(e["t"], e["span"], e["event"], e["update"]) for e in events if e["client"] == 2] == [
        (0.0, 1, "start", 1), (1.0, 1, "dropped", 1), (6.0, 2, "start", 2)]
    assert not [r for r in rows["comm"] if r[1] == 2]
    for name, t in trainer.clients[2].model.state_dict().items():
        assert torch.equal(t, before[name]), name
    assert {r[1] for r in rows["comm"] if r[2] == "down"} == {0, 1}  # the others' downloads are counted


def test_a_drop_is_logged_at_the_instant_the_connection_drops_in_the_span_it_falls_in(tiny_workspace, mnist,
                                                                                     tmp_path):
    """Issue 36: FedAvg on equal devices, spans of 4 s. Client 0 goes offline at 4.5 s, during its first upload
    (trained at 3.38 s, it would arrive at 5.83 s); client 1 at 3.0 s, during its first training (3.14 s). Each
    drop is logged at that instant, in the span it falls in (span 2 for client 0, not span 1 where it trained),
    and the log stays in the queue's order. Client 1's device trains on offline (its model keeps that) and it
    starts again when online."""
    _, params, part = tiny_workspace
    trainer = _trainer(_on_trace(params, tmp_path, part, async_eval_s=4.0), part, mnist, "drops", "fedavg")
    going_offline(trainer, 0, 4.5, 6.0)
    going_offline(trainer, 1, 3.0, 6.5)
    trainer.run()
    events, loop = _events("drops"), trainer.schedule
    drops = {e["client"]: (e["t"], e["span"]) for e in events if e["event"] == "dropped"}
    assert drops == {0: (4.5, 2), 1: (3.0, 1)}
    keys = [(e["t"], RANK[e["event"]], e["client"]) for e in events]
    assert keys == sorted(keys)
    assert all(loop.span_end(e["span"] - 1) <= e["t"] <= loop.span_end(e["span"]) for e in events)
    assert [e["event"] for e in events if e["client"] == 1][:5] == ["start", "downloaded", "dropped", "trained",
                                                                     "start"]
    assert [e["t"] for e in events if e["client"] == 1][4] == 6.5
    rows = _rows("drops")
    assert not [r for r in rows["comm"] if r[1] in (0, 1) and r[2] == "up"]  # neither upload arrived


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_a_resumed_async_run_ends_where_an_uninterrupted_one_does(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    # FedAsync with a buffer of 2 and spans that end mid-update: the checkpoint holds the buffer, downloads and
    # uploads in flight, and the queue
    params = with_section(_on_trace(params, tmp_path, part, slow=2, async_eval_s=4.0, async_buffer=2), "train",
                          rounds=3, checkpoint_every=1)
    straight = _trainer(params, part, mnist, "straight", "fedavg")
    straight.start()
    straight.run_round(1)
    assert any(u.download or u.upload for u in straight.schedule.updates)  # something in flight
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")  # what a process killed now leaves
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    with open(paths.RUNS / "resumed" / EVENTS_FILE, "a") as f:  # and a line of span 2 it was writing
        f.write('{"span": 2, "t": 9.0, "cli')
    for r in (2, 3):
        straight.run_round(r)
    straight.finish()
    resumed = _trainer(params, part, mnist, "resumed", "fedavg")
    assert resumed.start() == 2
    for r in (2, 3):
        resumed.run_round(r)
    resumed.finish()
    assert _events("resumed") == _events("straight")
    assert _rows("resumed") == _rows("straight")
    for n, t in straight.server.global_state.items():
        assert torch.equal(resumed.server.global_state[n], t), n
    assert resumed.server.version == straight.server.version > 0


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_a_resumed_async_run_with_lost_updates_in_flight_ends_where_an_uninterrupted_one_does(tiny_workspace, mnist,
                                                                                              tmp_path):
    """Spans of 3.1 s on the devices of the test above: at span 1's end client 1's lost update is still training
    offline (dropped at 3.0 s, trained at 3.14 s) and client 0's upload is about to be cut (4.5 s); the checkpoint
    holds both, and the resumed run logs and counts what the uninterrupted one does."""
    _, params, part = tiny_workspace
    params = with_section(_on_trace(params, tmp_path, part, async_eval_s=3.1), "train", rounds=3, checkpoint_every=1)

    def trainer(run):
        t = _trainer(params, part, mnist, run, "fedavg")
        going_offline(t, 0, 4.5, 6.0)
        going_offline(t, 1, 3.0, 6.5)
        return t

    straight = trainer("straight")
    straight.start()
    straight.run_round(1)
    assert straight.schedule.updates[1].offline_trained is not None
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    for r in (2, 3):
        straight.run_round(r)
    straight.finish()
    resumed = trainer("resumed")
    assert resumed.start() == 2
    for r in (2, 3):
        resumed.run_round(r)
    resumed.finish()
    events = _events("straight")
    assert _events("resumed") == events and _rows("resumed") == _rows("straight")
    assert [(e["client"], e["span"]) for e in events if e["event"] == "dropped"] == [(1, 1), (0, 2)]
