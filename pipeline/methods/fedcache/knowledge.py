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

stats(round_, labels, T) says what the cache holds, over all N samples, as the run's per-round
metrics (the dashboard's Cache tab): cache_coverage, the share of samples with a teacher (a
neighbour with knowledge); cache_staleness, the mean age in rounds (round_ - the round it was
uploaded; the zero-initialised knowledge of cold_start "zeros" counts as round 0's) of the
neighbour knowledge the teachers are built from, over every (sample, known neighbour) pair;
cache_teacher_acc, the share of samples with a teacher whose teacher's argmax is their label;
cache_teacher_entropy, the mean entropy (nats) of softmax(teacher / T) over those samples.
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

    def stats(self, round_: int, labels: torch.Tensor | None, T: float, chunk: int = 16384) -> dict[str, float]:
        """The cache as it stands now (the live cache, not a round-start snapshot), over all N samples, in
        float64 (see the module docstring). The teacher figures are left out when no sample has a teacher,
        the accuracy when `labels` is None. Chunks of samples bound the [chunk, R, C] gather."""
        n = self.relations.shape[0]
        if n == 0:
            return {}
        covered = correct = pairs = 0
        age_sum = entropy_sum = 0.0
        for lo in range(0, n, chunk):
            nbrs = self.relations[lo:lo + chunk]  # [b, R]
            weight = self.known[nbrs].double()  # [b, R]
            count = weight.sum(dim=1)
            has = count > 0
            age = (round_ - self.updated_in[nbrs].clamp(min=0)).double()  # zero-initialised knowledge: round 0's
            age_sum += float((age * weight).sum())
            pairs += int(count.sum())
            covered += int(has.sum())
            teacher = ((self.logits[nbrs].double() * weight.unsqueeze(-1)).sum(dim=1)[has]
                       / count[has].unsqueeze(-1))  # [b', C], as fetch() builds it
            if labels is not None:
                correct += int((teacher.argmax(dim=1) == labels[lo:lo + chunk][has].long()).sum())
            log_p = torch.log_softmax(teacher / T, dim=1)
            entropy_sum += float(-(log_p.exp() * log_p).sum())
        out = {"cache_coverage": covered / n}
        if covered:
            out["cache_staleness"] = age_sum / pairs
            if labels is not None:
                out["cache_teacher_acc"] = correct / covered
            out["cache_teacher_entropy"] = entropy_sum / covered
        return out

    def state_dict(self) -> dict:
        return {"logits": self.logits.clone(), "known": self.known.clone(), "updated_in": self.updated_in.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.logits.copy_(state["logits"])
        self.known.copy_(state["known"])
        self.updated_in.copy_(state["updated_in"])
        self.begin_round()
