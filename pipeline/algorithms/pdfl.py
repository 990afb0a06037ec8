"""pDFL: personalized decentralized FL -- attention-weighted body aggregation + two-way KD, no server.

The model is split into a shared body (ResNet stem + stages + pooling, i.e. `model.features`)
and a personal head (`model.head`). Clients sit on a peer graph (pipeline/topology.py).

One round, for every selected client i (all computed from the state at the start of the round,
so the order of clients does not matter):
  1. receive from every in-neighbour j its body (state_dict of stem + stages, BatchNorm
     buffers included) and its knowledge: P_j [C, C], the mean softmax(logits / T) of j's
     training samples of each class (eval mode, after j's last local training; zero rows for
     classes j lacks), and its class counts n_j [C];
  2. attention: a client's representation is its label-mix-weighted knowledge
     r = (n / sum n)[:, None] * P, flattened to C*C (the joint table of label and soft
     prediction). It is cut into `heads` contiguous chunks (each head sees a group of classes);
     each chunk is layer-normalised (no affine: identity query/key projections), the score is
     <q_i^h, k_j^h> / sqrt(d_h), a softmax over the neighbours per head, and the weights are
     the mean of the per-head softmaxes. A peer with a different label mix or different
     predictions scores low. `attention: false` -> uniform weights;
  3. aggregation: body_i <- self_weight * body_i + (1 - self_weight) * sum_j w_j body_j
     (float tensors; integer buffers -- BatchNorm's step counter -- keep i's own value);
  4. internal KD (head, body frozen): CE + kd_weight * T^2 * KL(t_int[y] || student / T). The
     teacher for class c is the attention-weighted mean of P_j[c] over the `top_k` neighbours
     with the highest weight among those holding class c, renormalised; calibration: if its
     argmax is not c, the probabilities of c and of the argmax are swapped (c becomes the argmax
     and the target keeps the softness of temperature T, which a one-hot mix would not);
  5. external KD (body, head frozen): CE + kd_weight * T^2 * KL(t_ext[y] || student / T), with
     t_ext[c] the attention-weighted mean of P_j[c] over all neighbours holding c (renormalised,
     not calibrated): the body is aligned with the neighbourhood's consensus;
     `order: body_then_head` runs 5 before 4; with a KD switch off that phase is CE only;
  6. compute its own knowledge (P_i, n_i) for the next round: "sending it back" is counted
     when the neighbours receive it.

Each phase is one pass (train.local_epochs epochs) over the local data, so a round is a
head-only pass (body forward without gradients, about a third of a training step) plus one
ordinary pass, plus one forward pass for the knowledge. The first phase uses the same batch
order as the other methods' epoch; the second its own seeded order. In the head phase the
body's parameters are frozen but the model stays in train mode (BatchNorm batch statistics,
running statistics updated), as FedRep-style implementations do.

Round 0 (nothing is sent): every client starts from a common body (client 0's initial one, as
FedAvg's global model; peers agree on it through the shared seed) and its own initial head, and
computes its knowledge from that initial model.
Bytes, per directed edge j -> i and round, on the sender's side (client j, "up", peer i):
kind "body" = nbytes of the body state_dict, kind "knowledge" = C*C*4 (float32 P) + C*8 (int64 n).
The topology is written to <run_dir>/topology.json (per-round edges when time-varying).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.algorithms.base import Algorithm
from pipeline.comm import UP, Payload
from pipeline.engine import Client, Context
from pipeline.seeds import torch_generator
from pipeline.topology import Topology

BODY_PREFIXES = ("stem.", "stages.")
Teacher = torch.Tensor | None  # a [C, C] table of class teachers, None when that KD term is off


def body_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The shared part: stem + stages parameters and buffers (pooling has none)."""
    return {n: t.detach().clone() for n, t in model.state_dict().items() if n.startswith(BODY_PREFIXES)}


def representations(soft: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """soft [K, C, C], counts [K, C] -> [K, C*C]: label-mix-weighted knowledge (joint label x prediction)."""
    mix = counts.float() / counts.sum(dim=1, keepdim=True).clamp_min(1).float()
    return (mix.unsqueeze(-1) * soft.float()).flatten(1)


def attention_weights(query: torch.Tensor, keys: torch.Tensor, heads: int) -> torch.Tensor:
    """query [D] (the client's representation), keys [m, D] (its neighbours') -> weights [m]
    summing to one: mean over heads of softmax_j(<LN(q^h), LN(k_j^h)> / sqrt(d_h))."""
    H = max(1, min(heads, query.numel()))
    weights = keys.new_zeros(len(keys))
    for q, k in zip(torch.tensor_split(query, H), torch.tensor_split(keys, H, dim=1)):
        d = q.numel()
        scores = F.layer_norm(k, (d,)) @ F.layer_norm(q, (d,)) / math.sqrt(d)
        weights += torch.softmax(scores, dim=0)
    return weights / H


def class_teachers(soft: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor, top_k: int | None = None,
                   calibrate: bool = False) -> torch.Tensor:
    """Neighbours' soft [m, C, C], counts [m, C], weights [m] -> teacher table [C, C] (probabilities;
    NaN rows for classes no neighbour holds). For each class: the weighted mean of the holders'
    rows, restricted to the top_k holders by weight when given, renormalised; `calibrate` swaps, in a row
    whose argmax is not its class, the probabilities of the class and of the argmax (the class becomes
    the argmax and the row keeps its softness, i.e. it stays a distribution at temperature T)."""
    m, C = counts.shape
    held = counts > 0
    w = torch.where(held, weights.unsqueeze(1), torch.zeros((), dtype=weights.dtype))  # [m, C]
    if top_k is not None and top_k < m:
        ranked = torch.where(held, weights.unsqueeze(1), torch.full((), -1.0, dtype=weights.dtype))
        chosen = torch.zeros_like(held).scatter_(0, ranked.topk(top_k, dim=0).indices, True)
        w = w * chosen
    total = w.sum(dim=0)  # [C]
    table = (w.unsqueeze(-1) * soft.float()).sum(dim=0) / total.clamp_min(1e-30).unsqueeze(1)
    table = table / table.sum(dim=1, keepdim=True).clamp_min(1e-30)
    if calibrate:  # swap the true class's probability with the teacher's top one where they differ
        rows = torch.arange(C)
        top = table.argmax(dim=1)
        top_p, true_p = table[rows, top], table[rows, rows]
        table[rows, top] = true_p
        table[rows, rows] = top_p
    table[total <= 0] = float("nan")
    return table


def aggregate_bodies(own: dict[str, torch.Tensor], neighbours: list[dict[str, torch.Tensor]], weights: torch.Tensor,
                     self_weight: float) -> dict[str, torch.Tensor]:
    """self_weight * own + (1 - self_weight) * sum_j weights[j] * neighbours[j] for float tensors
    (accumulated in float64); integer buffers keep the client's own value."""
    out = {}
    for name, mine in own.items():
        if not mine.is_floating_point():
            out[name] = mine.clone()
            continue
        acc = mine.double() * self_weight
        for w, state in zip(weights.tolist(), neighbours):
            acc = acc + state[name].double() * ((1 - self_weight) * w)
        out[name] = acc.to(mine.dtype)
    return out


def soft_kd(student: torch.Tensor, teacher: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 * KL(teacher || softmax(student / T)) with teacher *probabilities*, summed over rows that
    have a teacher (NaN rows skipped) and divided by the batch size (as engine.kd_loss)."""
    has = ~torch.isnan(teacher[:, 0])
    if not bool(has.any()):
        return student.new_zeros(())
    t = teacher[has]
    kl = (torch.special.xlogy(t, t) - t * F.log_softmax(student[has] / T, dim=1)).sum()
    return kl * (T * T) / len(student)


@torch.inference_mode()
def class_knowledge(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int, T: float,
                    batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(P [C, C] float32: mean softmax(logits / T) per class, zero rows for absent classes;
    n [C] int64 class counts), eval mode, on CPU."""
    model.eval()
    sums = torch.zeros(num_classes, num_classes, device=x.device)
    for start in range(0, len(y), batch_size):
        sums.index_add_(0, y[start:start + batch_size], torch.softmax(model(x[start:start + batch_size]) / T, dim=1))
    counts = torch.bincount(y, minlength=num_classes)
    return (sums / counts.clamp_min(1).unsqueeze(1)).float().cpu(), counts.long().cpu()


class PDFL(Algorithm):
    name = "pdfl"
    homogeneous_only = True

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.p = ctx.params.pdfl
        K, C = len(ctx.clients), ctx.num_classes
        self.topology = Topology(K, self.p, ctx.params.seed)  # a ConfigError here, before any training
        self.soft = torch.zeros(K, C, C)  # each client's latest knowledge, as its neighbours would receive it
        self.counts = torch.zeros(K, C, dtype=torch.int64)
        self.stats: dict[int, dict[str, float]] = {}  # round -> extras (diagnostics of the round just trained)
        self.last_weights: dict[int, tuple[list[int], list[float]]] = {}  # client -> (neighbours, weights)

    # -- knowledge ---------------------------------------------------------------------

    def _update_knowledge(self, client: Client) -> None:
        self.soft[client.id], self.counts[client.id] = class_knowledge(
            client.model, client.x_train, client.y_train, self.ctx.num_classes, self.p.T,
            self.ctx.params.train.eval_batch_size)

    def setup(self) -> None:
        # A common starting body (client 0's initial one, as FedAvg's global model): averaging
        # independently initialised networks would mix unaligned features. Peers agree on it through
        # the shared seed, so nothing is sent. Heads keep their own initial weights.
        common = body_state(self.ctx.clients[0].model)
        for client in self.ctx.clients:
            client.model.load_state_dict(common, strict=False)
        for client in self.ctx.clients:  # knowledge of the initial models; sent (and counted) in round 1
            self._update_knowledge(client)
        self.topology.write(self.ctx.run_dir / "topology.json")

    # -- one round ---------------------------------------------------------------------

    def _batches(self, client: Client, round_: int, phase: int):
        """Seeded shuffled batches of one phase; phase 0 uses the same order as engine.batches."""
        t = self.ctx.params.train
        for epoch in range(t.local_epochs):
            gen = torch_generator(self.ctx.params.seed, "batches", round_, client.id, phase * t.local_epochs + epoch)
            order = torch.randperm(client.num_train, generator=gen).to(client.x_train.device)
            for start in range(0, client.num_train, t.batch_size):
                idx = order[start:start + t.batch_size]
                yield client.x_train[idx], client.y_train[idx]

    def _loss(self, logits: torch.Tensor, y: torch.Tensor, teacher: torch.Tensor | None) -> torch.Tensor:
        loss = F.cross_entropy(logits, y)
        if teacher is not None and self.p.kd_weight > 0:
            loss = loss + self.p.kd_weight * soft_kd(logits, teacher[y], self.p.T)
        return loss

    def _train_head(self, client: Client, round_: int, phase: int, teacher: torch.Tensor | None) -> None:
        model = client.model
        model.train()
        for x, y in self._batches(client, round_, phase):
            with torch.no_grad():
                features = model.features(x)  # body frozen: no gradients reach it
            client.step(self._loss(model.head(features), y, teacher))

    def _train_body(self, client: Client, round_: int, phase: int, teacher: torch.Tensor | None) -> None:
        model = client.model
        model.train()
        head = list(model.head.parameters())
        for p in head:
            p.requires_grad_(False)  # no grad -> SGD leaves the head (and its momentum) alone
        try:
            for x, y in self._batches(client, round_, phase):
                client.step(self._loss(model(x), y, teacher))
        finally:
            for p in head:
                p.requires_grad_(True)

    def receive(self, round_: int, selected: list[int]) -> dict[int, tuple[dict, Teacher, Teacher]]:
        """Steps 1-3 for every selected client from the round-start state: {i: (new body, internal
        teacher [C, C] or None, external teacher or None)}; records the bytes of every directed edge."""
        neighbours = self.topology.in_neighbours(round_)
        ledger, p = self.ctx.ledger, self.p
        senders = sorted(set(selected) | {int(j) for i in selected for j in neighbours[i]})
        bodies = {j: body_state(self.ctx.clients[j].model) for j in senders}  # the round-start snapshot
        reps = representations(self.soft, self.counts)
        plans, maxima, edges = {}, [], 0
        for i in selected:
            J = [int(j) for j in neighbours[i]]
            for j in J:  # what travels over the edge j -> i
                ledger.record(round_, j, UP, Payload("body", bodies[j]), peer=i)
                ledger.record(round_, j, UP, Payload("knowledge", {"soft": self.soft[j], "counts": self.counts[j]}),
                              peer=i)
            edges += len(J)
            if p.attention:
                w = attention_weights(reps[i], reps[J], p.heads)
            else:
                w = torch.full((len(J),), 1.0 / len(J))
            self.last_weights[i] = (J, w.tolist())
            maxima.append(float(w.max()))
            body = aggregate_bodies(bodies[i], [bodies[j] for j in J], w, p.self_weight)
            device = self.ctx.device
            internal = (class_teachers(self.soft[J], self.counts[J], w, p.top_k, calibrate=True).to(device)
                        if p.internal_kd else None)
            external = class_teachers(self.soft[J], self.counts[J], w).to(device) if p.external_kd else None
            plans[i] = (body, internal, external)
        self.stats[round_] = {"edges": float(edges), "attention_max": sum(maxima) / max(len(maxima), 1)}
        return plans

    def train_round(self, round_: int, selected: list[int]) -> None:
        with self.ctx.timer("exchange"):
            plans = self.receive(round_, selected)
            for i in selected:
                self.ctx.clients[i].model.load_state_dict(plans[i][0], strict=False)
        for i in selected:
            client = self.ctx.clients[i]
            _, internal, external = plans[i]
            if self.p.order == "head_then_body":
                self._train_head(client, round_, 0, internal)
                self._train_body(client, round_, 1, external)
            else:
                self._train_body(client, round_, 0, external)
                self._train_head(client, round_, 1, internal)
            with self.ctx.timer("exchange"):
                self._update_knowledge(client)

    def evaluate(self, round_: int):
        rows, _ = super().evaluate(round_)
        return rows, dict(self.stats.get(round_, {}))

    def end_round(self, round_: int) -> None:
        self.topology.write(self.ctx.run_dir / "topology.json")
        self.stats = {r: s for r, s in self.stats.items() if r == round_}

    def state_dict(self) -> dict:
        return {"soft": self.soft.clone(), "counts": self.counts.clone(), "topology": self.topology.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.soft.copy_(state["soft"])
        self.counts.copy_(state["counts"])
        self.topology.load_state_dict(state["topology"])
