"""The simulated clock: how long each client's part of a round takes on its device, and when a round ends.

A selected client's round, from the instant the round starts (docs/devices.md):

  download_s  the bytes it receives at the round's start (the ledger's downloads, and what other clients
              send it over a directed edge) / its downlink;
  compute_s   the samples it trains (train.local_epochs x its training samples x each phase's repeat, summed
              over the method's phases, plus `LocalUpdate.extra_samples`: pDFL's peer copies) x its
              architecture's cost / the device's speed. A device's speed is
              given in samples per second of the reference architecture (`devices.reference_model`); the
              cost ratio of two architectures is the ratio of their computed forward FLOPs (training is
              taken as 3 forward passes for every architecture, so the factor cancels);
  exchange_s  the bytes of FedCache's per-step exchange (live / step), up / uplink + down / downlink;
  upload_s    the bytes of its end-of-round upload / its uplink.

Its upload completes at start + the sum of the four. After the last round, what a method sends every client
for the last evaluation (`Server.final_downloads`, MTFL's before_local) arrives over each client's downlink
from the round's end, paused while it is offline (`Clock.deliver`). The server's compute of a round (the FLOPs
its method counts, `Server.count_work`) is timed after the round's last upload at `devices.server_samples_per_s`
(`Clock.serve`; null: no time). Evaluation takes no simulated time; neither does a method's client work outside
its phases other than extra_samples (pDFL's attention fitting and neighbours' forward passes).

When a round ends: when the last participating client's upload completes, or at a deadline the schedule
sets (pipeline/train/schedules/: `deadline`, `quorum`): a client whose upload would complete after it is
dropped: it downloaded and trained, but its upload is not sent, not counted and not aggregated. When every
kept client has finished before the deadline, the server closes the round at the last upload: the round
lasts min(deadline, the slowest participant's duration).
Availability: a round starts at the clock's current time, or when the first selected client comes
online if none is online then; the selected clients offline at that instant sit the round out (no
download, no upload), and one that goes offline before its upload completes is dropped like a
straggler; the server sees its connection drop at that instant (which ends a sync round no later).
One that goes offline before its download completes never received it (`receivers`): the download is
not counted, as a cut upload is not, and the client does not train that round.

The async schedule has no rounds to close: pipeline/train/schedules/async_.py times each client's updates one by
one with the same parts (`client_time`) and moves the clock itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from models.resnet import build_model
from pipeline.federation.devices import TRAIN_FACTOR, Device


# ------------------------------------------------------------------------------------------ architecture cost

def forward_flops(model: nn.Module, input_shape: tuple[int, ...]) -> float:
    """FLOPs (2 x multiply-accumulates) of one sample's forward pass through the model's convolutions and
    linear layers (BatchNorm, activations and pooling are left out: a few percent of a ResNet's). Counted
    by running one zero sample with hooks, so it holds for any model built from these layers (FedAlt's
    multi-exit network included). The model is left as it was: eval mode for the pass (BatchNorm keeps its
    statistics), then each module's own mode back; no random numbers are drawn."""
    macs = 0

    def conv(module: nn.Conv2d, _inputs, output: torch.Tensor) -> None:
        nonlocal macs
        kh, kw = module.kernel_size
        macs += output.numel() * (module.in_channels // module.groups) * kh * kw

    def linear(module: nn.Linear, _inputs, output: torch.Tensor) -> None:
        nonlocal macs
        macs += output.numel() * module.in_features

    modes = {m: m.training for m in model.modules()}
    handles = [m.register_forward_hook(conv) for m in model.modules() if isinstance(m, nn.Conv2d)]
    handles += [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, nn.Linear)]
    first = next(model.parameters(), None)
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device=first.device if first is not None else "cpu",
                              dtype=first.dtype if first is not None else torch.float32))
    finally:
        for h in handles:
            h.remove()
        for m, training in modes.items():
            m.training = training
    return 2.0 * macs


def architecture_flops(name: str, input_shape: tuple[int, ...], num_classes: int) -> float:
    """forward_flops of a fresh `name` (resnet8/16/20) at this input shape; the global random state is kept."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(name, input_shape[0], num_classes)
    return forward_flops(model, input_shape)


# ------------------------------------------------------------------------------------------ one round

@dataclass(frozen=True)
class ClientTime:
    """A participant's simulated seconds in one round, from the round's start."""

    download_s: float
    compute_s: float
    exchange_s: float
    upload_s: float

    @property
    def duration(self) -> float:
        return self.download_s + self.compute_s + self.exchange_s + self.upload_s

    @property
    def downloaded(self) -> float:
        return self.download_s

    @property
    def trained(self) -> float:
        """When its local work (training and the per-step exchange) ends."""
        return self.download_s + self.compute_s + self.exchange_s


@dataclass
class RoundPlan:
    """What the clock decided about one round: absolute simulated seconds."""

    start: float
    times: dict[int, ClientTime]
    kept: list[int]  # the participants whose upload arrives, in participant order
    dropped: dict[int, str] = field(default_factory=dict)  # participant -> "deadline" | "offline"
    deadline: float | None = None  # the absolute deadline (deadline schedule)
    end: float = 0.0

    def finish(self, k: int) -> float:
        """When participant k's upload completes (or would have)."""
        return self.start + self.times[k].duration

    def busy_s(self) -> float:
        """Client-seconds spent on work the server used: each kept participant's time to its upload."""
        return sum(self.times[k].duration for k in self.kept)

    def client_s(self) -> float:
        """Client-seconds of the round: every participant, from its start to its end. What is not busy_s is
        waiting: idle after its upload while a sync round waits for the slowest, or dropped (docs/devices.md)."""
        return len(self.times) * (self.end - self.start)


def close_round(start: float, times: dict[int, ClientTime], online_until: dict[int, float],
                deadline: float | None = None) -> RoundPlan:
    """Who is kept and when the round ends (module docstring): at the last upload, or at `deadline` (an
    absolute instant; None: none). `online_until[k]`: when k goes offline (inf: stays online)."""
    plan = RoundPlan(start, dict(times), [], deadline=deadline)
    events = []  # when the server hears from each participant: its upload, or its connection dropping
    for k, t in times.items():
        finish = start + t.duration
        if online_until.get(k, math.inf) < finish:
            plan.dropped[k] = "offline"
            events.append(online_until[k])
        elif plan.deadline is not None and finish > plan.deadline:
            plan.dropped[k] = "deadline"
            events.append(finish)
        else:
            plan.kept.append(k)
            events.append(finish)
    last = max(events, default=start)
    plan.end = last if plan.deadline is None else min(plan.deadline, last)
    return plan


# ------------------------------------------------------------------------------------------ the clock

class Clock:
    """The federation's simulated time: its devices, each client's architecture cost, the current instant."""

    def __init__(self, devices: list[Device], client_flops: list[float], reference_flops: float,
                 server_samples_per_s: float | None = None):
        if len(devices) != len(client_flops):
            raise ValueError(f"{len(devices)} devices for {len(client_flops)} clients")
        self.devices = devices
        self.client_flops = list(client_flops)
        self.reference_flops = float(reference_flops)
        # the server's FLOPs a second: training samples of the reference architecture, 3 forward passes each
        self.server_flops_per_s = (None if server_samples_per_s is None
                                   else server_samples_per_s * TRAIN_FACTOR * self.reference_flops)
        self.now = 0.0

    def samples_per_s(self, k: int) -> float:
        """Client k's training speed on its own architecture."""
        return self.devices[k].samples_per_s * self.reference_flops / self.client_flops[k]

    def client_time(self, k: int, samples: int, down_bytes: int, up_bytes: int, exchange_up: int = 0,
                    exchange_down: int = 0) -> ClientTime:
        d = self.devices[k]
        return ClientTime(download_s=down_bytes / d.down_bytes_per_s,
                          compute_s=samples / self.samples_per_s(k),
                          exchange_s=exchange_up / d.up_bytes_per_s + exchange_down / d.down_bytes_per_s,
                          upload_s=up_bytes / d.up_bytes_per_s)

    def begin_round(self, selected: list[int]) -> tuple[float, list[int]]:
        """(start, participants): the round starts now, or when the first selected client comes online; the
        selected clients online at that instant take part."""
        start = self.now
        if selected and not any(self.devices[k].online_at(start) for k in selected):
            start = min(self.devices[k].next_online(start) for k in selected)
        return start, [k for k in selected if self.devices[k].online_at(start)]

    def receivers(self, start: float, down_bytes: dict[int, int]) -> list[int]:
        """The participants whose download (down_bytes[k] from `start`) completes before their device goes offline.
        The others never receive it: it is not counted, they do not train on it, and `close` drops them as offline
        (their connection drops before their upload could complete)."""
        return [k for k, b in down_bytes.items()
                if start + b / self.devices[k].down_bytes_per_s <= self.devices[k].online_until(start)]

    def online_until(self, start: float, clients) -> dict[int, float]:
        """When each of `clients`, online at `start`, next goes offline (inf: never)."""
        return {k: self.devices[k].online_until(start) for k in clients}

    def close(self, start: float, times: dict[int, ClientTime], deadline: float | None = None) -> RoundPlan:
        """Decide the round (close_round, with the schedule's deadline or none) and move the clock to its end."""
        plan = close_round(start, times, self.online_until(start, times), deadline)
        self.now = plan.end
        return plan

    def setup(self, up_bytes: dict[int, int]) -> dict[int, float]:
        """Round 0: every client's one-time upload from instant 0 (availability is not asked: a client joins
        when it is online); returns when each completes, and moves the clock to the last."""
        done = {k: self.now + b / self.devices[k].up_bytes_per_s for k, b in up_bytes.items()}
        self.now = max(done.values(), default=self.now)
        return done

    def serve(self, flops: float) -> float:
        """The server computes `flops` from the clock's instant (after a round's last upload); returns the seconds,
        and moves the clock on by them. No server speed (devices.server_samples_per_s null): no time."""
        seconds = 0.0 if self.server_flops_per_s is None else flops / self.server_flops_per_s
        self.now += seconds
        return seconds

    def deliver(self, down_bytes: dict[int, int]) -> dict[int, float]:
        """After the last round: client k receives down_bytes[k] over its downlink from the clock's instant,
        while it is online (an offline period pauses the transfer, which resumes when the client is next online:
        no round follows that it could miss); returns when each completes, and moves the clock to the last."""
        done = {}
        for k, b in down_bytes.items():
            device = self.devices[k]
            t, left = self.now, b / device.down_bytes_per_s
            while True:
                t = device.next_online(t)
                until = device.online_until(t)
                if t + left <= until:
                    done[k] = t + left
                    break
                left, t = left - (until - t), until
        self.now = max(done.values(), default=self.now)
        return done

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])


def build_clock(params, devices: list[Device], models: list[nn.Module], input_shape: tuple[int, ...],
                num_classes: int) -> Clock:
    """The run's clock: each client's architecture cost from its own model (one count per architecture)."""
    costs: dict[tuple, float] = {}
    flops = []
    for model in models:
        signature = (type(model).__name__, tuple((n, tuple(p.shape)) for n, p in model.named_parameters()))
        if signature not in costs:
            costs[signature] = forward_flops(model, input_shape)
        flops.append(costs[signature])
    return Clock(devices, flops, architecture_flops(params.devices.reference_model, input_shape, num_classes),
                 params.devices.server_samples_per_s)
