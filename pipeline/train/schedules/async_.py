"""`train.schedule: async` (docs/devices.md): every client trains whenever its device allows, and nobody waits
for anybody.

A client runs one local update after another, each in four events on the simulated clock:

  start       it is online (else it starts when it is next online): the server half makes its download from
              what it holds at this instant (`Server.configure` with this one client);
  downloaded  the download's bytes / its downlink later: the download is counted in the byte ledger
              (`Simulation.deliver`);
  trained     its training time later (the samples it trains / its speed, as the clock times a sync round):
              the local update runs (`Simulation.train_one`) and makes its upload;
  arrived     the upload's bytes / its uplink later: counted (`Simulation.receive`), and folded in by the server
              half (`Server.arrive`); the client's next update starts at this same instant.

or, when the device goes offline before the upload arrives, `dropped` at the instant it goes offline (queued
like the others, so it is logged in the span it falls in, in the queue's order); after a drop during the
training, the device's `trained` still comes at its own instant (the model keeps it), without an upload.

So a client's cadence depends on its own device and bytes only: a client 10x slower than the others delays
nobody. A client whose device goes offline before its upload arrives is dropped from that update, as under
sync, and starts again when it is next online: offline before its download completes, it never got the
download (not counted, not trained on); offline later, it downloaded and trained (its model keeps what it
trained), and its upload is neither counted nor folded in.

What happens next is decided by a priority queue of (instant, event, client): the earliest instant first; at
one instant arrivals before downloads before training before starts before drops (an upload that arrives at
the instant another client starts is in that client's download), then by client id. Each client has exactly one event
in the queue, so the order is a function of the seeds alone.

There are no rounds: a "round" is a span of simulated time, `train.async_eval_s` seconds (null: the median
client's update time, `median_update_s`), starting when the set-up uploads of round 0 are done. Round r's row
is the state at the end of span r: every event at or before that instant has happened, and every client is
evaluated (every `train.eval_every` spans). A ledger row belongs to the span in which its payload completed,
and carries that instant; transfers still under way when the last span ends are not counted.

An update's local training is seeded by the client's own update number (its batches are those of a sync
round of that number). The event log, one JSON object a line (span, instant, client, event, update), is
written to the run's folder as `events.jsonl` at each span's end; the queue and every client's update in
progress (its download, or its upload in flight) are in the checkpoint, so a killed run resumes to the same
events and results.
"""

from __future__ import annotations

import heapq
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.federation.contract import Upload
from pipeline.federation.ledger import DOWN, SETUP_ROUND, UP, Payload
from pipeline.train.schedules.base import Schedule

if TYPE_CHECKING:
    from pipeline.config import Params
    from pipeline.train.engine import Simulation, Timer

# the events of one update, in the order they are taken when they fall on the same instant; dropped: the device
# went offline before the update's transfers were done (last at an instant: it changes nothing the others see)
ARRIVED, DOWNLOADED, TRAINED, START, DROPPED = "arrived", "downloaded", "trained", "start", "dropped"
ORDER = (ARRIVED, DOWNLOADED, TRAINED, START, DROPPED)
RANK = {name: i for i, name in enumerate(ORDER)}
EVENTS_FILE = "events.jsonl"


@dataclass
class Update:
    """A client's update in progress: its number (1, 2, ...), when it started, and what it carries between events."""

    number: int = 0
    start: float = 0.0
    download: list[Payload] = field(default_factory=list)  # from start until trained
    upload: Upload | None = None  # from trained until arrived
    # the connection dropped during its training: when the device, offline, finishes it (the update is lost)
    offline_trained: float | None = None


def _payload_state(p: Payload) -> dict:
    return {"kind": p.kind, "arrays": dict(p.arrays), "sender": p.sender, "receiver": p.receiver}


def _payload(state: dict) -> Payload:
    return Payload(state["kind"], dict(state["arrays"]), state["sender"], state.get("receiver"))


def _upload(state: dict) -> Upload:
    """An upload as state_dict wrote it (a checkpoint from before typed uploads has no relay or metrics)."""
    return Upload([_payload(p) for p in state["payloads"]], [_payload(p) for p in state.get("relay", [])],
                  dict(state.get("metrics", {})))


def _nbytes(payloads: list[Payload]) -> int:
    return sum(p.nbytes for p in payloads)


class Async(Schedule):
    """The event loop over a Simulation with a clock: `begin` after set-up, then `run(r)` (span r) for r = 1, 2, ..."""

    name = "async"
    one_client_at_a_time = True

    def __init__(self, sim: Simulation, params: Params, run_dir: Path):
        super().__init__(sim, params, run_dir)
        if sim.clock is None:
            raise ValueError("the async schedule needs the simulated clock (devices.enabled)")
        self.clock = sim.clock
        self.eval_s = params.train.async_eval_s  # None: derived in begin
        self.events_path = Path(run_dir) / EVENTS_FILE
        self.queue: list[tuple[float, int, int]] = []  # (instant, RANK of the event, client)
        self.updates = [Update() for _ in sim.clients]
        self.t0 = 0.0  # when span 1 starts: the end of the set-up uploads
        self.span_s = 0.0
        self.log: list[dict] = []  # the current span's events, written at its end
        # the waiting share's figures of the current span (docs/devices.md): client-seconds spent on updates that
        # arrived, or are still under way at the span's end; an update dropped later takes back what it was credited
        self.busy_s = 0.0

    # -- set-up and spans ------------------------------------------------------------------------------

    def median_update_s(self) -> float:
        """The median over clients of one update's simulated seconds: its training time plus the bytes its method
        declares it downloads and uploads in a round (`Server.wire`; where a count is not exact, its bound), the
        set-up kinds left out, over its own links."""
        setup = {kind for (_, _, kind, _) in self.sim.ledger.counts.get(SETUP_ROUND, {})}
        times = []
        for k, client in enumerate(self.sim.clients):
            wire = self.sim.server.wire(k)
            moved = {d: sum(w.unit * w.count for (direction, kind), w in wire.items()
                            if direction == d and kind not in setup) for d in (DOWN, UP)}
            times.append(self.clock.client_time(k, self.sim.samples_trained(client, 1), moved[DOWN], moved[UP]).duration)
        return float(np.median(times))

    def begin(self) -> None:
        """After round 0: span 1 starts at the clock's instant, and so does every client's first update."""
        self.events_path.unlink(missing_ok=True)  # a new run's log
        self.t0 = self.clock.now
        self.span_s = float(self.eval_s) if self.eval_s is not None else self.median_update_s()
        for k in range(len(self.updates)):
            self._push(self.t0, START, k)

    def span_end(self, r: int) -> float:
        return self.t0 + r * self.span_s

    def client_s(self) -> float:
        """Client-seconds of a span: every client, the whole span (async has no participation to sample)."""
        return len(self.updates) * self.span_s

    def waiting(self) -> dict[str, float]:
        return {"sim_busy_s": self.busy_s, "sim_client_s": self.client_s()}

    def summary(self) -> dict:
        return {"async_eval_s": self.span_s}  # the span of simulated time a round stands for

    def run(self, r: int, timer: Timer) -> None:
        """Every event at or before the end of span r, in the queue's order; the clock moves to the span's end."""
        end = self.span_end(r)
        self.busy_s = 0.0
        handlers = {START: self._start, DOWNLOADED: self._downloaded, TRAINED: self._trained, ARRIVED: self._arrived,
                    DROPPED: self._dropped}
        while self.queue and self.queue[0][0] <= end:
            t, rank, k = heapq.heappop(self.queue)
            handlers[ORDER[rank]](r, t, k, timer)
        # updates still under way (a queued event other than a start, or than the training a device goes on with
        # offline after its update was dropped): busy up to the span's end
        self.busy_s += sum(end - max(self.updates[k].start, end - self.span_s)
                           for _, rank, k in self.queue if ORDER[rank] != START
                           and not (ORDER[rank] == TRAINED and self.updates[k].offline_trained is not None))
        self.clock.now = end
        self._write_log()

    # -- the four events -------------------------------------------------------------------------------

    def _start(self, r: int, t: float, k: int, timer: Timer) -> None:
        device = self.clock.devices[k]
        if not device.online_at(t):
            self._push(device.next_online(t), START, k)
            return
        u = self.updates[k]
        u.number, u.start = u.number + 1, t
        with timer("exchange"):
            u.download = self.sim.server.configure(r, [k])[k]  # what the server holds now
        self._log(r, t, k, START)
        downloaded, offline = t + _nbytes(u.download) / device.down_bytes_per_s, device.online_until(t)
        if offline < downloaded:  # the connection drops first: the download never completes, nor is trained on
            u.download = []
            self._push(offline, DROPPED, k)
            return
        self._push(downloaded, DOWNLOADED, k)

    def _downloaded(self, r: int, t: float, k: int, timer: Timer) -> None:
        u = self.updates[k]
        self.sim.deliver(r, k, u.download, at=t)
        self._log(r, t, k, DOWNLOADED)
        samples = self.sim.samples_trained(self.sim.clients[k], u.number)
        trained = t + self.clock.client_time(k, samples, 0, 0).compute_s
        offline = self.clock.devices[k].online_until(u.start)
        if offline < trained:  # the connection drops during the training: the update is dropped then
            u.offline_trained = trained  # (the device trains on, offline: its model keeps it)
            self._push(offline, DROPPED, k)
            return
        self._push(trained, TRAINED, k)

    def _trained(self, r: int, t: float, k: int, timer: Timer) -> None:
        u, device = self.updates[k], self.clock.devices[k]
        with timer("train"):  # seeded by the update's number, as a sync round by its number
            upload = self.sim.train_one(k, u.download, u.number)
        u.download = []
        self._log(r, t, k, TRAINED)
        if u.offline_trained is not None:  # dropped during the training: its upload never goes
            u.offline_trained = None
            self._push(t, START, k)  # it starts again when it is next online
            return
        arrival = t + _nbytes(upload.payloads) / device.up_bytes_per_s
        offline = device.online_until(u.start)  # not before t: a drop during the training was queued at the download
        if offline < arrival:  # the connection drops during the upload: the update is dropped then
            self._push(offline, DROPPED, k)
            return
        u.upload = upload
        self._push(arrival, ARRIVED, k)

    def _arrived(self, r: int, t: float, k: int, timer: Timer) -> None:
        u = self.updates[k]
        self.sim.receive(r, k, u.upload, at=t)
        with timer("exchange"):
            self.sim.server.arrive(r, k, u.upload)
        u.upload = None
        self.busy_s += t - max(u.start, self.span_end(r - 1))  # this span's part of the update (earlier spans counted theirs)
        self._log(r, t, k, ARRIVED)
        self._push(t, START, k)  # the next update starts at once (when online)

    def _dropped(self, r: int, t: float, k: int, timer: Timer) -> None:
        """The device went offline at t, before the update's upload arrived: the update is lost. During its download:
        nothing was counted or trained. During its training: the device trains on, offline (its `trained` event comes
        at its own instant, without an upload). During its upload: the upload is not counted. The client starts
        again when it is next online (after its training, when that is still going on)."""
        u = self.updates[k]
        # its time was wasted: take back what earlier spans counted as busy (this span counts none of it)
        self.busy_s -= max(0.0, self.span_end(r - 1) - u.start)
        self._log(r, t, k, DROPPED)
        if u.offline_trained is not None:
            self._push(u.offline_trained, TRAINED, k)
        else:
            self._push(t, START, k)  # offline now: it starts when it is next online

    # -- queue, log, checkpoint ------------------------------------------------------------------------

    def _push(self, t: float, event: str, k: int) -> None:
        heapq.heappush(self.queue, (float(t), RANK[event], k))

    def _log(self, r: int, t: float, k: int, event: str) -> None:
        self.log.append({"span": r, "t": t, "client": k, "event": event, "update": self.updates[k].number})

    def _write_log(self) -> None:
        with open(self.events_path, "a") as f:
            f.writelines(json.dumps(e) + "\n" for e in self.log)
            f.flush()
            os.fsync(f.fileno())
        self.log = []

    def events(self) -> list[dict]:
        """The run's event log so far (what events.jsonl holds)."""
        if not self.events_path.is_file():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    def resume(self, r: int) -> None:
        """On resume from span r's checkpoint: keep the events of spans up to r (a killed run may have written
        the next span's, or part of a line of them), atomically."""
        if not self.events_path.is_file():
            return
        kept = []
        for line in self.events_path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by the kill: of a span after the checkpoint
                continue
            if event["span"] <= r:
                kept.append(line + "\n")
        tmp = self.events_path.with_name(EVENTS_FILE + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, self.events_path)

    def state_dict(self) -> dict:
        return {"t0": self.t0, "span_s": self.span_s, "queue": sorted(self.queue),
                "updates": [{"number": u.number, "start": u.start, "offline_trained": u.offline_trained,
                             "download": [_payload_state(p) for p in u.download],
                             "upload": None if u.upload is None else {
                                 "payloads": [_payload_state(p) for p in u.upload.payloads],
                                 "relay": [_payload_state(p) for p in u.upload.relay], "metrics": dict(u.upload.metrics)}}
                            for u in self.updates]}

    def load_state_dict(self, state: dict) -> None:
        self.t0, self.span_s = float(state["t0"]), float(state["span_s"])
        self.queue = [(float(t), int(rank), int(k)) for t, rank, k in state["queue"]]
        heapq.heapify(self.queue)
        self.updates = [Update(int(u["number"]), float(u["start"]), [_payload(p) for p in u["download"]],
                               None if u["upload"] is None else _upload(u["upload"]),
                               None if u.get("offline_trained") is None else float(u["offline_trained"]))
                        for u in state["updates"]]
        self.log = []
