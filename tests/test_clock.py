"""The simulated clock and the sync / deadline schedules (issue 24, first increment).

Pure clock tests first (an architecture's computed cost, a 10x slower client, who misses a deadline,
availability), then tiny real runs (3 MNIST clients, 2 rounds): the clock changes no accuracy or byte
when nothing is dropped; one slow device makes every sync round 10x longer; a deadline drops exactly
the clients that miss it (the ledger shows their download and no upload, the server never folds them
in); the same seeds give the same rows, and a resumed run continues the clock where it stood.
"""

from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pytest
import torch

from conftest import tiny, with_section
from pipeline import paths
from pipeline.config import ConfigError
from pipeline.federation.contract import state_bytes
from pipeline.federation.clock import Clock, ClientTime, architecture_flops, close_round, forward_flops
from pipeline.train.schedules.deadline import deadline_length
from pipeline.federation.devices import Availability, Device
from pipeline.methods.registry import REGISTRY
from pipeline.results.store import ResultsDB, RunResultsDB, rebuild_index
from pipeline.train.engine import Trainer
from models.resnet import build_model


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these runs check the clock's and the ledger's bookkeeping, not learning, and
    a quarter of the convolution is a quarter of their arithmetic."""
    return small_mnist


# ------------------------------------------------------------------------------------------ architecture cost

def test_an_architecture_costs_its_convolutions_and_head():
    # ResNet-8 on one 28 x 28 channel, multiply-accumulates layer by layer (stem, 3 stages, 1x1 shortcuts, head)
    macs = (28 * 28 * 16 * 1 * 9 + 2 * 28 * 28 * 16 * 16 * 9
            + 14 * 14 * 32 * 16 * 9 + 14 * 14 * 32 * 32 * 9 + 14 * 14 * 32 * 16
            + 7 * 7 * 64 * 32 * 9 + 7 * 7 * 64 * 64 * 9 + 7 * 7 * 64 * 32 + 64 * 10)
    assert architecture_flops("resnet8", (1, 28, 28), 10) == 2 * macs
    costs = [architecture_flops(n, (3, 32, 32), 10) for n in ("resnet8", "resnet16", "resnet20")]
    assert costs[0] < costs[1] < costs[2]


def test_counting_an_architecture_leaves_the_model_and_the_random_state_alone():
    torch.manual_seed(5)
    model = build_model("resnet8", 1, 10)
    model.train()
    model.head.eval()  # a module in its own mode keeps it
    before = {n: t.clone() for n, t in model.state_dict().items()}
    rng_state = torch.get_rng_state()
    assert forward_flops(model, (1, 28, 28)) == architecture_flops("resnet8", (1, 28, 28), 10)  # the same count
    architecture_flops("resnet20", (1, 28, 28), 10)
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert model.training and not model.head.training
    for n, t in model.state_dict().items():
        assert torch.equal(t, before[n]), n  # BatchNorm statistics untouched


# ------------------------------------------------------------------------------------------ one round, pure

def _device(speed=100.0, up=1000.0, down=1000.0, availability=None):
    return Device(speed, up, down, availability)


def _clock(devices, **kw):
    return Clock(devices, [1.0] * len(devices), 1.0, **kw)


def _round(clock, samples, down=200, up=100):
    """One round in which every client trains its samples and moves these bytes."""
    start, participants = clock.begin_round(list(range(len(samples))))
    return clock.close(start, {k: clock.client_time(k, samples[k], down, up) for k in participants})


def test_a_client_ten_times_slower_makes_a_sync_round_ten_times_longer():
    even = _clock([_device() for _ in range(3)])
    slow = _clock([_device(), _device(10.0, 100.0, 100.0), _device()])  # client 1: a tenth the speed and bandwidth
    samples = [50, 50, 50]
    a, b = _round(even, samples), _round(slow, samples)
    assert a.end == pytest.approx(0.5 + 0.3)  # 50 samples at 100/s, 300 bytes at 1000 B/s
    assert b.end - b.start == pytest.approx(10 * (a.end - a.start))
    assert b.kept == [0, 1, 2] and not b.dropped  # sync waits for everyone
    b2 = _round(slow, samples)  # the next round starts where the last ended
    assert b2.start == b.end and slow.now == pytest.approx(2 * b.end)


def test_an_architecture_twice_as_costly_trains_half_as_fast():
    clock = Clock([_device(), _device()], [2.0, 4.0], 2.0)
    assert clock.samples_per_s(0) == 100.0 and clock.samples_per_s(1) == 50.0


DURATIONS = {0: ClientTime(0, 1.0, 0, 0), 1: ClientTime(0.5, 1.0, 0, 0.5), 2: ClientTime(0, 4.0, 0, 0)}  # 1, 2, 4 s


@pytest.mark.parametrize("deadline_s, quantile, kept, end", [
    (2.5, None, [0, 1], 12.5),  # client 2 (4 s) misses 2.5 s: the round ends at the deadline
    (2.0, None, [0, 1], 12.0),  # finishing exactly at the deadline makes it
    (0.5, None, [], 10.5),  # everyone misses it
    (10.0, None, [0, 1, 2], 14.0),  # nobody misses it: the round ends at the last upload, not the deadline
    (None, 0.5, [0, 1], 12.0),  # the median of 1, 2, 4
    (None, 0.75, [0, 1], 13.0),  # numpy's linear quantile: 2 + 0.5 * (4 - 2)
    (None, 1.0, [0, 1, 2], 14.0),
])
def test_a_deadline_drops_exactly_the_clients_that_miss_it(deadline_s, quantile, kept, end):
    plan = close_round(10.0, DURATIONS, {}, 10.0 + deadline_length([t.duration for t in DURATIONS.values()],
                                                                   deadline_s, quantile))
    assert plan.kept == kept
    assert plan.dropped == {k: "deadline" for k in DURATIONS if k not in kept}
    assert plan.end == pytest.approx(end)
    assert plan.deadline == pytest.approx(10.0 + (deadline_s if deadline_s is not None
                                                  else np.quantile([1.0, 2.0, 4.0], quantile)))
    assert [plan.finish(k) for k in DURATIONS] == [11.0, 12.0, 14.0]


def _availability(flips, starts_online=True):
    return Availability(1.0, 1.0, np.random.default_rng(0), starts_online, list(flips))


def test_a_client_that_goes_offline_mid_round_is_dropped_and_one_offline_at_the_start_sits_it_out():
    devices = [_device(), _device(availability=_availability([1.5, 1e9])), _device(availability=_availability(
        [0.2, 1e9], starts_online=False))]
    clock = _clock(devices)
    start, participants = clock.begin_round([0, 1, 2])
    assert (start, participants) == (0.0, [0, 1])  # client 2 is offline until 0.2 s
    plan = clock.close(start, {0: clock.client_time(0, 100, 0, 0), 1: clock.client_time(1, 400, 0, 0)})
    assert plan.kept == [0] and plan.dropped == {1: "offline"}
    assert plan.end == 1.5  # sync: the server hears of client 1 when its connection drops


def test_a_round_waits_for_the_first_selected_client_to_come_online():
    devices = [_device(availability=_availability([3.0, 1e9], starts_online=False)),
               _device(availability=_availability([2.0, 1e9], starts_online=False))]
    clock = _clock(devices)
    assert clock.begin_round([0, 1]) == (2.0, [1])
    assert clock.begin_round([0]) == (3.0, [0])


# ------------------------------------------------------------------------------------------ tiny real runs

def test_a_rounds_waiting_is_what_its_participants_did_not_spend_on_used_work():
    """The waiting share's figures (docs/devices.md): busy = the kept participants' times to their upload,
    the round's client-seconds = participants x its length."""
    sync = close_round(10.0, DURATIONS, {})  # 1, 2 and 4 s: the first two idle 3 and 2 s of the 4
    assert (sync.busy_s(), sync.client_s()) == pytest.approx((7.0, 12.0))
    cut = close_round(10.0, DURATIONS, {}, 12.5)  # client 2 dropped: its 2.5 s are waiting too
    assert (cut.busy_s(), cut.client_s()) == pytest.approx((3.0, 7.5))


def metrics(run: str) -> dict[str, list[float]]:
    """The waiting share's round metrics of a run, round by round."""
    con = duckdb.connect(str(paths.RUNS / run / "run.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT name, value FROM round_metrics WHERE name LIKE 'sim_%' ORDER BY round").fetchall()
    finally:
        con.close()
    out: dict[str, list[float]] = {}
    for name, value in rows:
        out.setdefault(name, []).append(value)
    return out


def _trainer(params, part, mnist, run: str, method: str = "fedcache") -> Trainer:
    return Trainer(params, REGISTRY[method], part, mnist, paths.RUNS / run, paths.CHECKPOINTS / f"{run}.pt",
                   RunResultsDB(paths.RUNS / run / "run.duckdb"), [paths.PARTITION])


def _rows(run: str) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(paths.RUNS / run / "run.duckdb"), read_only=True)
    try:
        return {
            "rounds": con.execute("SELECT round, mean_acc, bytes_up, bytes_down, sim_time_s FROM rounds "
                                  "ORDER BY round").fetchall(),
            "comm": con.execute("SELECT round, client_id, direction, kind, bytes, peer_id, sim_time_s FROM comm "
                                "ORDER BY ALL").fetchall(),
            "clients": con.execute("SELECT round, client_id, acc, n_test FROM client_rounds ORDER BY ALL").fetchall(),
        }
    finally:
        con.close()


def _run(params, part, mnist, run: str, method: str = "fedcache") -> tuple[Trainer, dict[str, list[tuple]]]:
    trainer = _trainer(params, part, mnist, run, method)
    trainer.run()
    return trainer, _rows(run)


def _trace(tmp_path, part, slow: int | None = None, name: str = "devices.csv") -> str:
    """A CSV trace of identical devices (10 ms a sample, 1,000 kbit/s), client `slow` at a tenth of both."""
    lines = ["client_id,computation,communication"]
    for k in range(part.num_clients):
        lines.append(f"{k + 1},{100 if k == slow else 10},{100 if k == slow else 1000}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _lengths(rounds) -> list[float]:
    ends = [r[-1] for r in rounds]
    return [b - a for a, b in zip([0.0] + ends, ends)]


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_the_clock_changes_no_accuracy_or_byte(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    _, plain = _run(params, part, mnist, "plain")
    timed_trainer, timed = _run(with_section(params, "devices", enabled=True), part, mnist, "timed")
    assert [r[:4] for r in timed["rounds"]] == [r[:4] for r in plain["rounds"]]
    assert [r[:6] for r in timed["comm"]] == [r[:6] for r in plain["comm"]]
    assert timed["clients"] == plain["clients"]
    assert all(r[-1] is None for r in plain["rounds"] + plain["comm"])  # no clock: no simulated time
    ends = [r[-1] for r in timed["rounds"]]
    assert all(b > a > 0 for a, b in zip(ends, ends[1:]))  # cumulative
    for rnd, *_, t in timed["comm"]:  # every payload completes within its round
        assert ([0.0] + ends)[rnd] <= t <= ends[rnd]
    assert timed_trainer.summary()["sim_time_s"] == pytest.approx(ends[-1])


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_one_device_ten_times_slower_makes_every_sync_round_ten_times_longer(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    slow = int(np.argmax(np.diff(part.train_offsets)))  # the client with most samples, the slowest of equals
    params = with_section(params, "devices", enabled=True, server_samples_per_s=None)  # the devices' time alone
    _, even = _run(with_section(params, "devices", trace=_trace(tmp_path, part)), part, mnist, "even")
    _, one_slow = _run(with_section(params, "devices", trace=_trace(tmp_path, part, slow, "slow.csv")), part, mnist,
                       "slow")
    assert len(even["rounds"]) == 3  # set-up and 2 rounds
    assert _lengths(one_slow["rounds"]) == pytest.approx([10 * x for x in _lengths(even["rounds"])], rel=1e-9)
    assert [r[:4] for r in one_slow["rounds"]] == [r[:4] for r in even["rounds"]]  # sync drops nobody


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_a_deadline_drops_the_clients_that_miss_it_from_the_round(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    slow = int(np.argmax(np.diff(part.train_offsets)))
    params = with_section(params, "devices", enabled=True, trace=_trace(tmp_path, part, slow))
    params = with_section(params, "train", schedule="deadline", deadline_quantile=0.5)
    params = with_section(params, "fedcache", consistency="round")  # a per-step exchange cannot have a deadline yet
    trainer, rows = _run(params, part, mnist, "deadline")
    for rnd in (1, 2):
        sent = {(k, d, kind) for r, k, d, kind, *_ in rows["comm"] if r == rnd}
        for k in range(part.num_clients):
            assert (k, "down", "knowledge") in sent  # everyone selected downloaded
            assert ((k, "up", "logits") in sent) == (k != slow)  # the slow one's upload never went
    # the server never folded the slow client's logits in; the others' in round 2
    ids = trainer.server.ctx.client_sample_ids
    assert (trainer.server.cache.updated_in[ids(slow)] == -1).all()
    assert all((trainer.server.cache.updated_in[ids(k)] == 2).all() for k in range(3) if k != slow)
    # a round lasts the deadline: the median of the three clients' times, the middle client's own
    plan = trainer.sim.last_plan
    assert plan.dropped == {slow: "deadline"}
    middle = sorted(t.duration for t in plan.times.values())[1]
    assert _lengths(rows["rounds"])[2] == pytest.approx(middle) == pytest.approx(plan.deadline - plan.start)
    # the waiting share's figures of round 2: the two kept clients' times, of 3 participants x the round
    waiting = metrics("deadline")
    assert waiting["sim_busy_s"][1] == pytest.approx(sum(plan.times[k].duration for k in plan.kept))
    assert waiting["sim_client_s"][1] == pytest.approx(3 * middle)
    assert len(waiting["sim_busy_s"]) == 2  # rounds 1 and 2, not the set-up
    [series] = RunResultsDB(paths.RUNS / "deadline" / "run.duckdb").series([trainer.run_id])  # what the report reads
    assert series.sim_times == {r[0]: r[-1] for r in rows["rounds"]}
    assert series.waiting_share == pytest.approx(1 - sum(waiting["sim_busy_s"]) / sum(waiting["sim_client_s"]))
    uploads = {k: b for r, k, d, _, b, *_ in rows["comm"] if r == 2 and d == "up"}
    assert rows["rounds"][2][2] == sum(uploads.values())  # the round's bytes up: the kept uploads only
    # the same seeds: the same rows, simulated times included
    _, again = _run(params, part, mnist, "deadline-again")
    assert again == rows


def test_a_deadline_with_a_per_step_exchange_is_refused_before_any_work(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = with_section(with_section(params, "devices", enabled=True), "train", schedule="deadline", deadline_s=1.0)
    with pytest.raises(ConfigError, match=r"train.schedule = 'deadline'.*fedcache.consistency: round"):
        _trainer(params, part, mnist, "refused")
    assert not (paths.RUNS / "refused" / "run.duckdb").exists()


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_offline_clients_sit_a_round_out_the_same_way_every_run(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = with_section(params, "devices", enabled=True, online_mean_s=0.3, offline_mean_s=0.3)
    params = with_section(params, "train", rounds=4)
    trainer, rows = _run(with_section(params, "fedcache", consistency="round"), part, mnist, "flaky")
    took_part = {(r, k) for r, k, d, *_ in rows["comm"] if r > 0 and d == "down"}
    assert 0 < len(took_part) < 4 * 3  # some clients sat some rounds out
    for r, k, d, *_ in rows["comm"]:
        assert r == 0 or (r, k) in took_part  # a client that sat out sent and received nothing
    _, again = _run(with_section(params, "fedcache", consistency="round"), part, mnist, "flaky-again")
    assert again == rows


def going_offline(trainer: Trainer, k: int, offline_s: float, online_s: float) -> None:
    """Client k's device: online until offline_s, offline until online_s, then online for good."""
    trainer.sim.clock.devices[k].availability = Availability(1e9, 1.0, np.random.default_rng(0), True,
                                                             [offline_s, online_s])


def test_a_client_whose_connection_drops_mid_download_neither_receives_it_nor_trains(tiny_workspace, mnist,
                                                                                      tmp_path):
    """Issue 36: a participant (online at the round's start) whose device goes offline before its download completes
    never got it: its download is not counted (as a cut upload is not), it does not train (its model stays as
    it was), and the round drops it as offline, hearing of it when the connection drops (docs/devices.md)."""
    _, params, part = tiny_workspace
    params = with_section(params, "devices", enabled=True, trace=_trace(tmp_path, part))
    trainer = _trainer(params, part, mnist, "cut", "fedavg")
    trainer.start()
    t0, clock = trainer.sim.clock.now, trainer.sim.clock
    download_s = state_bytes(trainer.server.global_state) / clock.devices[1].down_bytes_per_s
    going_offline(trainer, 1, t0 + download_s / 2, t0 + 1e6)
    before = {n: t.clone() for n, t in trainer.clients[1].model.state_dict().items()}
    trainer.run_round(1)
    plan = trainer.sim.last_plan
    assert plan.kept == [0, 2] and plan.dropped == {1: "offline"}
    sent = {(k, d, kind) for _, k, d, kind, *_ in trainer.ledger.rows(1)}
    assert sent == {(k, d, "params") for k in (0, 2) for d in ("down", "up")} | {(k, "up", "num_samples") for k in (0, 2)}
    # nothing to or from client 1
    for name, t in trainer.clients[1].model.state_dict().items():
        assert torch.equal(t, before[name]), name  # not trained on a download it never got
    assert plan.end == pytest.approx(max(plan.finish(0), plan.finish(2)))
    assert plan.busy_s() == pytest.approx(plan.times[0].duration + plan.times[2].duration)


def test_pdfl_times_the_peer_copies_its_clients_train(tiny_workspace, mnist, tmp_path):
    """Issue 36: a pDFL client trains, besides its own phases, a copy of each of its external_peers highest-weighted
    neighbours' models for external_steps steps of min(batch_size, its samples) samples (step 5 of
    pipeline/methods/pdfl/method.py): its device's time counts those samples too, at its own speed (the copies
    are of its own architecture)."""
    _, params, part = tiny_workspace
    params = tiny(with_section(params, "devices", enabled=True, trace=_trace(tmp_path, part)), "pdfl")
    trainer = _trainer(params, part, mnist, "pdfl", "pdfl")
    trainer.start()
    trainer.run_round(1)
    plan, clock, p = trainer.sim.last_plan, trainer.sim.clock, params.pdfl
    for k, client in enumerate(trainer.clients):
        copies = min(p.external_peers, len(client.state["neighbours"]))
        assert copies > 0
        samples = (trainer.sim.samples_trained(client, 1)
                   + copies * p.external_steps * min(params.train.batch_size, client.num_train))
        assert plan.times[k].compute_s == pytest.approx(samples / clock.samples_per_s(k), rel=1e-12)


def _server_flops(trainer: Trainer, method: str, selected: list[int]) -> float:
    """The server's FLOPs in round 1, by docs/devices.md's formulas, from the run's sizes."""
    server, ctx = trainer.server, trainer.server.ctx
    n = sum(len(ctx.client_sample_ids(k)) for k in selected)
    C, K = ctx.num_classes, ctx.num_clients
    if method == "fedavg":  # the sample-weighted mean: a multiply and an add per uploaded number
        return 2.0 * len(selected) * sum(t.numel() for t in server.global_state.values())
    if method == "fedcache":  # each teacher: R neighbours' C logits, weighted and summed, and divided
        R = server.cache.relations.shape[1]
        return n * (2 * R * C + R + C)
    if method == "fd":  # the leave-one-out means of the [K, C, C] class logits (once a round)
        return 3.0 * K * C * C
    if method == "feddkc":  # A4^S trained on every uploaded sample, server_epochs times, 3 forward passes each
        features = ctx.initial_model(0).stem(torch.zeros(1, *ctx.input_shape))
        return server.epochs * n * 3 * forward_flops(server.model, tuple(features.shape[1:]))
    raise AssertionError(method)


@pytest.mark.parametrize("method", ["fedavg", "fedcache", "fd", "feddkc"])
def test_the_servers_compute_takes_its_time_after_the_last_upload(tiny_workspace, mnist, tmp_path, method):
    """Issue 36: with devices.server_samples_per_s S the server computes 3 x S x (the reference architecture's forward
    FLOPs) a second, and a round's server work (its downloads and answers, the aggregation, a server model's
    training) is timed after the round's last upload: the next round starts that much later. null (the default):
    no time, as before."""
    _, params, part = tiny_workspace
    params = with_section(tiny(params, method), "devices", enabled=True, trace=_trace(tmp_path, part))
    params = with_section(params, "fedcache", consistency="round")
    for speed in (None, 2.0):
        trainer = _trainer(with_section(params, "devices", server_samples_per_s=speed), part, mnist, f"s{speed}",
                           method)
        trainer.start()
        trainer.run_round(1)
        plan, clock = trainer.sim.last_plan, trainer.sim.clock
        server_s = 0.0 if speed is None else _server_flops(trainer, method, list(plan.times)) / (
            3 * clock.reference_flops * speed)
        assert clock.now - plan.end == pytest.approx(server_s, rel=1e-9, abs=1e-12)
        assert speed is None or server_s > 0


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_a_resumed_run_continues_the_clock(tiny_workspace, mnist, tmp_path):
    _, params, part = tiny_workspace
    params = with_section(params, "devices", enabled=True, trace=_trace(tmp_path, part, slow=0))
    params = with_section(params, "train", schedule="deadline", deadline_quantile=0.5, checkpoint_every=1)
    params = with_section(params, "fedcache", consistency="round")
    straight = _trainer(params, part, mnist, "straight")
    straight.start()
    straight.run_round(1)
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")  # what a process killed now leaves
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    straight.run_round(2)
    resumed = _trainer(params, part, mnist, "resumed")
    assert resumed.start() == 2
    resumed.run_round(2)
    assert resumed.sim.clock.now == straight.sim.clock.now > 0
    assert resumed.ledger.state_dict() == straight.ledger.state_dict()  # the rows' simulated times included


# ------------------------------------------------------------------------------------------ results files

OLD_RUN_SCHEMA = """
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, algorithm VARCHAR, dataset VARCHAR, setting VARCHAR, params JSON,
                   git_rev VARCHAR, started_at TIMESTAMP, finished_at TIMESTAMP, status VARCHAR);
CREATE TABLE rounds (run_id VARCHAR, round INTEGER, mean_acc DOUBLE, bytes_up BIGINT, bytes_down BIGINT, wall_s DOUBLE,
                     PRIMARY KEY (run_id, round));
CREATE TABLE client_rounds (run_id VARCHAR, round INTEGER, client_id INTEGER, acc DOUBLE, n_test INTEGER,
                            PRIMARY KEY (run_id, round, client_id));
CREATE TABLE comm (run_id VARCHAR, round INTEGER, client_id INTEGER, direction VARCHAR, kind VARCHAR, bytes BIGINT,
                   peer_id INTEGER);
CREATE TABLE round_metrics (run_id VARCHAR, round INTEGER, name VARCHAR, value DOUBLE, PRIMARY KEY (run_id, round, name));
INSERT INTO runs VALUES ('old', 'local', 'mnist', 'homo', '{}', 'rev', now(), now(), 'finished');
INSERT INTO rounds VALUES ('old', 1, 0.5, 10, 20, 0.1);
INSERT INTO comm VALUES ('old', 1, 0, 'up', 'logits', 10, -1);
"""


def test_results_files_from_before_the_clock_still_load_and_take_timed_rows(tmp_path):
    runs = tmp_path / "results" / "runs"
    for name in ("old", "mixed"):
        (runs / name).mkdir(parents=True)
        con = duckdb.connect(str(runs / name / "run.duckdb"))
        con.execute(OLD_RUN_SCHEMA.replace("'old'", f"'{name}'"))
        con.close()
    db = ResultsDB(runs / "mixed" / "run.duckdb")  # written to: its tables gain the columns
    db.start_run("new", "fedcache", "mnist", "homo", {}, "rev")
    db.write_round("new", 1, 0.5, 7, 8, 0.1, [(0, 0.5, 2)], [(1, 0, "up", "logits", 7, -1, 1.25)], sim_time_s=2.5)
    index = rebuild_index(tmp_path / "results" / "results.duckdb")
    assert index.runs == 3
    con = duckdb.connect(str(tmp_path / "results" / "results.duckdb"), read_only=True)
    assert con.execute("SELECT run_id, sim_time_s FROM rounds ORDER BY run_id").fetchall() == [
        ("mixed", None), ("new", 2.5), ("old", None)]
    assert con.execute("SELECT run_id, sim_time_s FROM comm ORDER BY run_id").fetchall() == [
        ("mixed", None), ("new", 1.25), ("old", None)]
    con.close()
