"""The knowledge cache on the hot path: [N, C] logits and [N, R] neighbour ids as tensors.

fetch(ids) returns, for each sample, the mean of its R neighbours' latest logits (eq. 16-17);
update(ids, logits) stores a sample's newest logits (eq. 13). No per-sample Python.

Consistency (a named choice, recorded with every run):
  live   fetch reads the cache as it is now: updates made earlier in the same round, by this
         or other clients, are visible at once (the official code's semantics);
  round  fetch reads a snapshot taken at begin_round(); updates land in the live cache and
         become visible next round (lets clients train in parallel);
  step   clients take each local step together: fetch reads the cache as it stood after the
         previous step, and the step's updates are held back until end_step() (the
         vectorized executor's lockstep exchange).

Cold start: a neighbour that has never uploaded has no knowledge. With cold_start "skip"
(default) it is left out of the mean, and a sample none of whose neighbours has knowledge
gets a NaN row, meaning "no teacher": the client trains that sample on CE alone. So in the
first round under `round` consistency every sample trains on CE only; under `live`, samples
of clients that train later in round 1 already see earlier clients' logits. With "zeros"
the cache starts as the paper's all-zero vectors (eq. 9) and every neighbour counts, so early
teachers are pulled toward the uniform distribution (the official behaviour).
"""

from __future__ import annotations

import torch


class KnowledgeCache:
    def __init__(self, relations: torch.Tensor, num_classes: int, consistency: str = "live", cold_start: str = "skip"):
        if consistency not in ("live", "round", "step") or cold_start not in ("skip", "zeros"):
            raise ValueError(f"bad consistency {consistency!r} or cold_start {cold_start!r}")
        self.relations = relations.long()
        n = relations.shape[0]
        self.consistency = consistency
        self.logits = torch.zeros(n, num_classes)
        self.known = torch.full((n,), cold_start == "zeros")
        self.updated_in = torch.full((n,), -1, dtype=torch.long)  # round of each sample's latest upload
        self._view = (self.logits, self.known)
        self._pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []  # step consistency: this step's updates

    def begin_round(self) -> None:
        if self.consistency == "round":
            self._view = (self.logits.clone(), self.known.clone())
        else:
            self._view = (self.logits, self.known)

    def fetch(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean knowledge of each sample's neighbours [b, C]; NaN rows where none has any."""
        logits, known = self._view
        nbrs = self.relations[ids]  # [b, R]
        weight = known[nbrs].to(logits.dtype)  # [b, R]
        total = (logits[nbrs] * weight.unsqueeze(-1)).sum(dim=1)
        count = weight.sum(dim=1, keepdim=True)
        return total / count  # 0/0 -> NaN: no teacher

    def update(self, ids: torch.Tensor, logits: torch.Tensor, round_: int) -> None:
        if self.consistency == "step":
            self._pending.append((ids, logits.detach().clone(), round_))
        else:
            self._write(ids, logits, round_)

    def end_step(self) -> None:
        """Step consistency: the step's uploads land together, after every client has read."""
        for ids, logits, round_ in self._pending:
            self._write(ids, logits, round_)
        self._pending.clear()

    def _write(self, ids: torch.Tensor, logits: torch.Tensor, round_: int) -> None:
        self.logits[ids] = logits.detach().to(self.logits.dtype)
        self.known[ids] = True
        self.updated_in[ids] = round_

    def state_dict(self) -> dict:
        return {"logits": self.logits.clone(), "known": self.known.clone(), "updated_in": self.updated_in.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.logits.copy_(state["logits"])
        self.known.copy_(state["known"])
        self.updated_in.copy_(state["updated_in"])
        self.begin_round()
