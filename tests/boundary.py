"""What crossed the client/server boundary, tallied apart from the ledger (the conformance suite's byte check).

The simulation has two doors (pipeline/train/engine.py): `deliver` (payloads reaching a client: downloads, and
peers' relayed payloads) and `receive` (a client's upload, or a per-step exchange's). `tally_the_boundary` wraps
both on a trainer and adds up the bytes of every tensor and array reachable from what goes through them, by
walking the objects (every field of an Upload but its relay, which is counted where it is delivered), not by
asking Payload.nbytes. If anything travels that the ledger does not count, the two totals differ.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch


def array_bytes(obj) -> int:
    """The bytes of every tensor and numpy array reachable from obj (dicts, lists, tuples, dataclasses, objects)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(array_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return sum(array_bytes(v) for v in obj)
    if dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        return sum(array_bytes(v) for v in vars(obj).values())
    return 0


def tally_the_boundary(trainer) -> dict[str, int]:
    """Wrap trainer.sim's deliver and receive; the returned dict's "bytes" grows by what crosses."""
    sim, crossed = trainer.sim, {"bytes": 0}
    deliver, receive = sim.deliver, sim.receive

    def tallied_deliver(round_, client, payloads, at=None):
        crossed["bytes"] += array_bytes(payloads)
        return deliver(round_, client, payloads, at)

    def tallied_receive(round_, client, upload, at=None):
        crossed["bytes"] += array_bytes({name: value for name, value in vars(upload).items() if name != "relay"})
        return receive(round_, client, upload, at)

    sim.deliver, sim.receive = tallied_deliver, tallied_receive
    return crossed
