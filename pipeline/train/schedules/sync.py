"""`train.schedule: sync`: rounds; every round the selected clients download, train and upload, and the
round closes when the last upload arrives (with the clock, the slowest participant sets its length)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.seeds import rng
from pipeline.train.schedules.base import Schedule

if TYPE_CHECKING:
    from pipeline.federation.clock import ClientTime
    from pipeline.train.engine import Timer


class Sync(Schedule):
    name = "sync"

    def select(self, round_: int) -> list[int]:
        """The round's participants: `train.participation` of the clients, drawn by the round's seed."""
        K = len(self.sim.clients)
        m = max(1, round(self.params.train.participation * K))
        if m == K:
            return list(range(K))
        return sorted(rng(self.params.seed, "sampling", round_).choice(K, m, replace=False).tolist())

    def deadline(self, start: float, times: dict[int, ClientTime]) -> float | None:
        """The instant the round closes at, from its start and its participants' times; None: its last upload."""
        return None

    def run(self, round_: int, timer: Timer) -> None:
        with timer("select"):
            selected = self.select(round_)
        self.sim.run_round(round_, selected, timer, self.deadline)

    def waiting(self) -> dict[str, float]:
        plan = self.sim.last_plan
        return {} if plan is None else {"sim_busy_s": plan.busy_s(), "sim_client_s": plan.client_s()}
