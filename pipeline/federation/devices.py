"""The device each client runs on: compute speed, uplink and downlink bandwidth, availability.

(Not `pipeline/torch_device.py`, which picks the torch device the simulation itself computes on.)

A `Device` is what the simulated clock (pipeline/federation/clock.py) needs of one client:

  samples_per_s     training speed, in samples per second of the *reference* architecture
                    (`devices.reference_model`); another architecture's speed is this scaled by the
                    ratio of the two architectures' computed costs (clock.py);
  up_bytes_per_s    uplink bandwidth, bytes per second;
  down_bytes_per_s  downlink bandwidth, bytes per second;
  availability      None (always online) or an `Availability`: alternating online and offline periods.

A population is one device per client, either drawn (`draw_population`: log-normal speeds and
bandwidths around the medians in params.yaml's `devices:` section, one seeded stream per client, so
client k's device does not change when clients are added) or read from a trace file in FedScale's
device-capacity format (`load_trace`; docs/devices.md). No torch here: the core stays importable
without it being used, and a trace is checked before any training.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.seeds import rng

if TYPE_CHECKING:
    from pipeline.config import DevicesParams

# A training sample costs this many forward passes (the backward pass about twice the forward):
# FedScale's convention too, which turns a trace's per-sample inference latency into training time.
TRAIN_FACTOR = 3.0
# FedScale counts payloads in kilobits of 1,024 bits (bytes / 1024 * 8) and bandwidth in those per second.
FEDSCALE_KBIT_BYTES = 1024 / 8
MBIT_BYTES = 1e6 / 8  # params.yaml's bandwidths are in megabits (10^6 bits) per second
TRACE_FIELDS = ("computation", "communication")
FORMAT_HELP = ("a FedScale device-capacity file is a pickled dict {client_id: {'computation': ms per sample, "
               "'communication': kbit/s}}, or a .csv with the header client_id,computation,communication "
               "(docs/devices.md)")


@dataclass
class Availability:
    """Alternating online and offline periods, each exponentially distributed with its mean, drawn
    lazily from the client's own seeded stream: the same instants whatever order they are asked in
    (a resumed run sees what an uninterrupted one does)."""

    online_mean_s: float
    offline_mean_s: float
    gen: np.random.Generator
    starts_online: bool
    flips: list[float] = field(default_factory=list)  # increasing instants where the state changes

    @classmethod
    def draw(cls, online_mean_s: float, offline_mean_s: float, gen: np.random.Generator) -> "Availability":
        # the stationary state at t = 0 (online a share on / (on + off) of the time); periods are memoryless,
        # so the first one's remainder has the same distribution as a whole period
        starts_online = bool(gen.random() < online_mean_s / (online_mean_s + offline_mean_s))
        return cls(online_mean_s, offline_mean_s, gen, starts_online)

    def _index(self, t: float) -> int:
        """How many flips happened at or before t (drawing periods until one ends after t)."""
        while not self.flips or self.flips[-1] <= t:
            online = self.starts_online == (len(self.flips) % 2 == 0)  # the state of the period being drawn
            length = self.gen.exponential(self.online_mean_s if online else self.offline_mean_s)
            self.flips.append((self.flips[-1] if self.flips else 0.0) + float(length))
        return bisect.bisect_right(self.flips, t)

    def online_at(self, t: float) -> bool:
        return self.starts_online == (self._index(t) % 2 == 0)

    def online_until(self, t: float) -> float:
        """The end of the online period that holds t (t itself when offline at t)."""
        i = self._index(t)
        return self.flips[i] if self.starts_online == (i % 2 == 0) else t

    def next_online(self, t: float) -> float:
        """The first instant at or after t when the device is online."""
        i = self._index(t)
        return t if self.starts_online == (i % 2 == 0) else self.flips[i]


@dataclass
class Device:
    samples_per_s: float
    up_bytes_per_s: float
    down_bytes_per_s: float
    availability: Availability | None = None

    def online_at(self, t: float) -> bool:
        return self.availability is None or self.availability.online_at(t)

    def online_until(self, t: float) -> float:
        return math.inf if self.availability is None else self.availability.online_until(t)

    def next_online(self, t: float) -> float:
        return t if self.availability is None else self.availability.next_online(t)


@dataclass(frozen=True)
class TraceEntry:
    """One client's capacity as FedScale's file gives it: its id there, the inference latency of the
    reference model in milliseconds per sample, and its bandwidth in kbit/s (one figure, up and down)."""

    client_id: int
    computation_ms: float
    communication_kbps: float

    def device(self) -> Device:
        bandwidth = self.communication_kbps * FEDSCALE_KBIT_BYTES
        return Device(1000.0 / (TRAIN_FACTOR * self.computation_ms), bandwidth, bandwidth)


# ---------------------------------------------------------------------------------------------- trace files

class _CapacityUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, numbers, strings and numpy scalars): a pickle can run any
    code it names, and a trace file is data."""

    ALLOWED = {("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a device-capacity file never holds")


def _positive(value: Any) -> float | None:
    """value as a positive finite float, or None when it is not one (a bool is not a number here)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value > 0 else None


def _client_id(value: Any) -> int | None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


_FIX = "correct or remove it"
_UNITS = {"computation": "milliseconds per sample (> 0)", "communication": "kbit/s (> 0)"}


def _entry(where: str, client_id: int, values: dict[str, Any]) -> TraceEntry:
    parsed = {}
    for name in TRACE_FIELDS:
        if name not in values:
            raise ConfigError(f"{where} has no {name!r} ({_UNITS[name]}); {_FIX}. The format: {FORMAT_HELP}")
        parsed[name] = _positive(values[name])
        if parsed[name] is None:
            raise ConfigError(f"{where}: {name} = {values[name]!r} is not a positive finite number of "
                              f"{_UNITS[name]}; {_FIX}")
    return TraceEntry(client_id, parsed["computation"], parsed["communication"])


def _from_pickle(path: Path, data: bytes) -> list[TraceEntry]:
    try:
        table = _CapacityUnpickler(io.BytesIO(data)).load()
    except Exception as err:  # noqa: BLE001 (any failure to unpickle: not this format)
        raise ConfigError(f"devices.trace: {path} is not a device-capacity file ({type(err).__name__}: {err}); "
                          f"{FORMAT_HELP}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"devices.trace: {path} holds a {type(table).__name__}, not a dict of clients; {FORMAT_HELP}")
    entries = []
    for position, (key, values) in enumerate(table.items()):
        where = f"devices.trace: {path}, entry {position} (client id {key!r})"
        client_id = _client_id(key)
        if client_id is None:
            raise ConfigError(f"{where}: the client id must be an integer; {_FIX}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where} is a {type(values).__name__}, not a dict with 'computation' and "
                              f"'communication'; {_FIX}")
        entries.append(_entry(where, client_id, values))
    return entries


def _from_csv(path: Path, text: str) -> list[TraceEntry]:
    entries: list[TraceEntry] = []
    header: list[str] | None = None
    lines: dict[int, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in next(csv.reader([line]))]
        where = f"devices.trace: {path}, line {number}"
        if header is None:
            header = cells
            missing = [c for c in ("client_id", *TRACE_FIELDS) if c not in header]
            if missing:
                raise ConfigError(f"{where}: the header {','.join(cells)!r} lacks {', '.join(missing)}; the first line "
                                  "must be client_id,computation,communication")
            continue
        if len(cells) != len(header):
            raise ConfigError(f"{where} has {len(cells)} fields, the header {len(header)}; {_FIX}")
        row = dict(zip(header, cells))
        try:
            client_id = int(row["client_id"])
        except ValueError:
            raise ConfigError(f"{where}: client_id = {row['client_id']!r} is not an integer; {_FIX}") from None
        values: dict[str, Any] = {}
        for name in TRACE_FIELDS:
            try:
                values[name] = float(row[name])
            except ValueError:
                values[name] = row[name]
        entry = _entry(where, client_id, values)
        if client_id in lines:
            raise ConfigError(f"{where}: client {client_id} is also on line {lines[client_id]}; keep one of them")
        lines[client_id] = number
        entries.append(entry)
    return entries


def load_trace(path: str | Path) -> list[TraceEntry]:
    """Every client of a device-capacity file, by ascending client id; ConfigError naming the file and the
    entry (pickle: its position and client id) or line (CSV) of the first problem, and how to fix it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"devices.trace = {str(path)!r}: no such file; give the path of a device-capacity file "
                          "(relative to the project root) or null to draw the devices")
    data = path.read_bytes()
    if path.suffix.lower() == ".csv":
        try:
            entries = _from_csv(path, data.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"devices.trace: {path} is not UTF-8 text; {FORMAT_HELP}") from None
    else:
        entries = _from_pickle(path, data)
    if not entries:
        raise ConfigError(f"devices.trace: {path} lists no client; {FORMAT_HELP}")
    return sorted(entries, key=lambda e: e.client_id)


# ---------------------------------------------------------------------------------------------- populations

def _availability(p: DevicesParams, seed: int, k: int) -> Availability | None:
    if p.online_mean_s is None:
        return None
    return Availability.draw(p.online_mean_s, p.offline_mean_s, rng(seed, "device_availability", k))


def draw_population(p: DevicesParams, num_clients: int, seed: int) -> list[Device]:
    """One device per client: speed and bandwidths log-normal around their medians (sigma 0: all equal to them),
    each client from its own stream (seed, "devices", k)."""
    devices = []
    for k in range(num_clients):
        z = rng(seed, "devices", k).standard_normal(3)
        devices.append(Device(
            samples_per_s=p.samples_per_s * math.exp(p.samples_per_s_sigma * z[0]),
            up_bytes_per_s=p.up_mbps * MBIT_BYTES * math.exp(p.bandwidth_sigma * z[1]),
            down_bytes_per_s=p.down_mbps * MBIT_BYTES * math.exp(p.bandwidth_sigma * z[2]),
            availability=_availability(p, seed, k)))
    return devices


def trace_population(entries: list[TraceEntry], num_clients: int, p: DevicesParams, seed: int) -> list[Device]:
    """Client k runs on the trace's (k mod n)-th client by ascending id (a trace shorter than the federation is
    cycled, as FedScale does); availability is drawn as for a drawn population (the trace has none)."""
    devices = []
    for k in range(num_clients):
        device = entries[k % len(entries)].device()
        device.availability = _availability(p, seed, k)
        devices.append(device)
    return devices


def population(p: DevicesParams, num_clients: int, seed: int) -> list[Device]:
    """The run's devices: from `devices.trace` when set, else drawn."""
    if p.trace is not None:
        return trace_population(load_trace(p.trace), num_clients, p, seed)
    return draw_population(p, num_clients, seed)
