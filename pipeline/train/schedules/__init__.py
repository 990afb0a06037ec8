"""Schedules: who trains when, and what they read (`train.schedule`, docs/devices.md).

The simulation (pipeline/train/engine.py's `Simulation`) runs the clients through the executor and writes
the byte ledger; a schedule only drives it, one module each:

  sync      rounds: the selected clients download, train and upload; a round closes at its last upload;
  deadline  the same rounds, each closed at a deadline: uploads that would arrive later are dropped;
  quorum    the same rounds, each closed when a quorum of its participants' uploads have arrived;
  async     no rounds: every client's updates one after another, each at its own device's pace; a
            "round" is a span of simulated time (evaluated and written as a round is).

A schedule is a class with the hooks of `base.Schedule`; the Trainer calls them and nothing else about schedules.
Adding one is a module here plus its name in `SCHEDULES` (and in the params schema's `train.schedule`).
"""

from __future__ import annotations

from pipeline.train.schedules.base import Schedule


def schedule_class(name: str) -> type[Schedule]:
    """The class of `train.schedule: name` (imported on demand: a run loads only its own)."""
    if name == "sync":
        from pipeline.train.schedules.sync import Sync as cls
    elif name == "deadline":
        from pipeline.train.schedules.deadline import Deadline as cls
    elif name == "quorum":
        from pipeline.train.schedules.quorum import Quorum as cls
    elif name == "async":
        from pipeline.train.schedules.async_ import Async as cls
    else:
        raise ValueError(f"unknown schedule {name!r}")
    return cls
