"""What every schedule implements (pipeline/train/schedules/__init__.py lists them)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import Params
    from pipeline.train.engine import Simulation, Timer


class Schedule:
    """Drives a Simulation round by round (or span by span)."""

    name = "base"
    one_client_at_a_time = False  # True: the executor must be the sequential one (each update at its own instant)

    def __init__(self, sim: Simulation, params: Params, run_dir: Path):
        self.sim, self.params, self.run_dir = sim, params, Path(run_dir)

    def begin(self) -> None:
        """After the set-up round (round 0), before round 1."""

    def run(self, round_: int, timer: Timer) -> None:
        """Round `round_` (a span of simulated time, for a schedule without rounds)."""
        raise NotImplementedError

    def waiting(self) -> dict[str, float]:
        """The latest round's figures for the waiting share (docs/devices.md): sim_busy_s and sim_client_s
        (round metrics); {} without the clock."""
        return {}

    def summary(self) -> dict:
        """What the run's summary adds about the schedule."""
        return {}

    def resume(self, round_: int) -> None:
        """A run resumes from round `round_`'s checkpoint: drop what the schedule wrote after it."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
