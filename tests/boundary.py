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

from pipeline.federation.encoding import NPY_HEADER, npy_bytes


def arrays_in(obj):
    """Every tensor and numpy array reachable from obj (dicts, lists, tuples, dataclasses, objects)."""
    if isinstance(obj, (torch.Tensor, np.ndarray)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from arrays_in(v)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from arrays_in(v)
    elif dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        yield from arrays_in(vars(obj))


def array_bytes(obj) -> int:
    """The bytes of every tensor and numpy array reachable from obj."""
    return sum(a.numel() * a.element_size() if isinstance(a, torch.Tensor) else int(a.nbytes) for a in arrays_in(obj))


def serialized_bytes(obj) -> int:
    """The same arrays written in numpy's .npy format, less its header each (docs/compression.md)."""
    return sum(npy_bytes(a) - NPY_HEADER for a in arrays_in(obj))


def tally_the_boundary(trainer) -> dict[str, int]:
    """Wrap trainer.sim's deliver and receive; the returned dict's "bytes" grows by what crosses, "serialized" by
    its length in .npy files less their headers."""
    sim, crossed = trainer.sim, {"bytes": 0, "serialized": 0}
    deliver, receive = sim.deliver, sim.receive

    def add(obj) -> None:
        crossed["bytes"] += array_bytes(obj)
        crossed["serialized"] += serialized_bytes(obj)

    def tallied_deliver(round_, client, payloads, at=None):
        add(payloads)
        return deliver(round_, client, payloads, at)

    def tallied_receive(round_, client, upload, at=None):
        add({name: value for name, value in vars(upload).items() if name != "relay"})
        return receive(round_, client, upload, at)

    sim.deliver, sim.receive = tallied_deliver, tallied_receive
    return crossed


def assert_ledger_follows_the_declared_formula(trainer) -> None:
    """Every ledger row (round, client, direction, kind) weighs what the method's `wire` declares."""
    server, ledger = trainer.server, trainer.ledger
    wires = {c.id: server.wire(c.id) for c in trainer.clients}
    rows = [row for r in sorted(ledger.counts) for row in ledger.rows(r)]
    for r, k, direction, kind, size, _ in rows:
        where = f"{server.name} round {r} client {k} {direction} {kind!r} ({size:,} B)"
        wire = wires[k].get((direction, kind))
        assert wire is not None, f"{where}: not declared in {type(server).__name__}.wire"
        assert size % wire.unit == 0, f"{where}: not a whole number of {wire.unit}-byte units"
        count = size // wire.unit
        if wire.exact:
            assert count == wire.count, f"{where}: {count} units of {wire.unit} B, declared {wire.count}"
        else:
            assert 1 <= count <= wire.count, f"{where}: {count} units of {wire.unit} B, declared 1..{wire.count}"
    if server.name != "local":
        assert rows, f"{server.name}: nothing was counted"


# -- building and running a method's trainer in a test workspace (tests/conftest.py's tiny_workspace) --

def trainer_for(params, part, mnist, method: str, run: str, **section):
    """A Trainer of `method` with keys of its params section replaced (e.g. encode_up="int8"), writing under
    paths.RUNS / run."""
    from conftest import with_section
    from pipeline import paths
    from pipeline.methods.registry import REGISTRY
    from pipeline.results.store import RunResultsDB
    from pipeline.train.engine import Trainer

    if section:
        params = with_section(params, method, **section)
    return Trainer(params, REGISTRY[method], part, mnist, paths.RUNS / run, paths.CHECKPOINTS / f"{run}.pt",
                   RunResultsDB(paths.RUNS / run / "run.duckdb"), [paths.PARTITION])


def run_tallied(trainer, rounds: int = 2) -> dict[str, int]:
    """Tally the boundary (tally_the_boundary), then start the trainer and run rounds 1..rounds."""
    crossed = tally_the_boundary(trainer)
    trainer.start()
    for r in range(1, rounds + 1):
        trainer.run_round(r)
    return crossed


def record_uploads(trainer) -> dict[int, dict[str, torch.Tensor]]:
    """Wrap the simulation's upload door: client -> the arrays of its latest upload, filled as rounds run."""
    sim, got = trainer.sim, {}
    receive = sim.receive

    def keep(round_, client, upload, at=None):
        got.update({client: p.arrays for p in upload.payloads})
        return receive(round_, client, upload, at)

    sim.receive = keep
    return got
