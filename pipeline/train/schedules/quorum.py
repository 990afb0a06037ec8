"""`train.schedule: quorum`: over-selection (Bonawitz et al., 2019, "Towards Federated Learning at Scale": the
server selects more devices than it needs and closes the round once enough have reported). The rounds of sync,
each closed at the arrival of the ceil(`train.quorum` x participants)-th upload; the later ones are dropped as
stragglers (they downloaded and trained; their uploads are neither counted nor aggregated). Participants whose
connection drops before their upload arrives do not count toward the quorum; when too few can reach it, the
round closes at its last event, as sync does.

Unlike `deadline`, the round's length is set by a count of arrivals, not by a time: a round of fast devices
ends early, and a round where most are slow waits for the quorum whatever it takes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pipeline.train.schedules.deadline import Deadline

if TYPE_CHECKING:
    from pipeline.federation.clock import ClientTime


class Quorum(Deadline):  # a deadline schedule whose deadline is the quorum's arrival
    name = "quorum"

    def deadline(self, start: float, times: dict[int, ClientTime]) -> float | None:
        online_until = self.sim.clock.online_until(start, times)
        arrivals = sorted(start + t.duration for k, t in times.items() if start + t.duration <= online_until[k])
        needed = math.ceil(self.params.train.quorum * len(times))
        return arrivals[needed - 1] if 0 < needed <= len(arrivals) else None
