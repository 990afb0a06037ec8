"""`train.schedule: deadline`: the rounds of sync, each closed at start + D, D = `train.deadline_s`, or the
`train.deadline_quantile` quantile (numpy's linear interpolation) of the participants' durations. A client whose
upload would complete later is dropped: it downloaded and trained, but its upload is neither counted nor
aggregated (pipeline/federation/clock.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pipeline.train.schedules.sync import Sync

if TYPE_CHECKING:
    from pipeline.federation.clock import ClientTime


def deadline_length(durations: list[float], deadline_s: float | None, quantile: float | None) -> float:
    """The deadline in seconds after the round's start: deadline_s, or that quantile of the durations."""
    if deadline_s is not None:
        return float(deadline_s)
    if quantile is None:
        raise ValueError("a deadline needs deadline_s or a quantile")
    return float(np.quantile(np.asarray(durations, dtype=float), quantile))


class Deadline(Sync):
    name = "deadline"

    def deadline(self, start: float, times: dict[int, ClientTime]) -> float | None:
        t = self.params.train
        return start + deadline_length([x.duration for x in times.values()], t.deadline_s, t.deadline_quantile)
