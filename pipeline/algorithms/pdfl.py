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

from pipeline.algorithms.base import LocalUpdate, Method, Phase, Upload
from pipeline.clients import Client, Context
from pipeline.comm import Payload
from pipeline.losses import ce_rows, soft_kd_rows
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


def is_head(name: str) -> bool:
    return name.startswith("head.")


def is_body(name: str) -> bool:
    return not is_head(name)


class PDFLClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.pdfl

    def phases(self, round_):
        head, body = Phase(0, is_head, "head"), Phase(1, is_body, "body")
        if self.p.order == "head_then_body":
            return [head, body]
        return [Phase(0, is_body, "body"), Phase(1, is_head, "head")]

    def begin(self, client, download, round_):
        """Steps 2-3 on the client: score the neighbours from their knowledge, aggregate bodies,
        build the internal (calibrated, top-k) and external class teachers."""
        p = self.p
        bodies = {m.sender: m.arrays for m in download if m.kind == "body"}
        knowledge = {m.sender: m.arrays for m in download if m.kind == "knowledge"}
        J = sorted(bodies)
        soft = torch.stack([knowledge[j]["soft"] for j in J])
        counts = torch.stack([knowledge[j]["counts"] for j in J])
        if p.attention:
            mine = representations(client.state["soft"][None], client.state["counts"][None])[0]
            w = attention_weights(mine, representations(soft, counts), p.heads)
        else:
            w = torch.full((len(J),), 1.0 / len(J))
        client.state["neighbours"], client.state["weights"] = torch.tensor(J), w
        body = aggregate_bodies(body_state(client.model), [bodies[j] for j in J], w, p.self_weight)
        client.model.load_state_dict(body, strict=False)
        y = client.y_train
        targets = {}
        if p.internal_kd:
            targets["internal"] = class_teachers(soft, counts, w, p.top_k, calibrate=True).to(y.device)[y]
        if p.external_kd:
            targets["external"] = class_teachers(soft, counts, w).to(y.device)[y]
        return targets

    def loss(self, model, step, phase):
        if phase.name == "head":
            with torch.no_grad():
                features = model.features(step.x)  # body frozen: no gradients reach it
            logits, teacher = model.head(features), step.t.get("internal")
        else:
            logits, teacher = model(step.x), step.t.get("external")
        rows = ce_rows(logits, step.y)
        if teacher is not None and self.p.kd_weight > 0:
            rows = rows + self.p.kd_weight * soft_kd_rows(logits, teacher, self.p.T)
        return rows

    def end(self, client, targets, records, round_):
        """Step 6: the client's new knowledge, published to its neighbours (counted when they receive it)."""
        publish(client, self.num_classes, self.p.T, self.params.train.eval_batch_size)
        return Upload(kept={"soft": client.state["soft"], "counts": client.state["counts"],
                            "weights": client.state["weights"]})


def publish(client: Client, num_classes: int, T: float, batch_size: int) -> None:
    client.state["soft"], client.state["counts"] = class_knowledge(
        client.model, client.x_train, client.y_train, num_classes, T, batch_size)


class PDFL(Method):
    name = "pdfl"
    homogeneous_only = True
    client_cls = PDFLClient

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.p = ctx.params.pdfl
        K, C = len(ctx.clients), ctx.num_classes
        self.topology = Topology(K, self.p, ctx.params.seed)  # a ConfigError here, before any training
        self.soft = torch.zeros(K, C, C)  # each client's latest knowledge, as its neighbours would receive it
        self.counts = torch.zeros(K, C, dtype=torch.int64)
        self.stats: dict[int, dict[str, float]] = {}  # round -> extras (diagnostics of the round just trained)
        self.last_weights: dict[int, tuple[list[int], list[float]]] = {}  # client -> (neighbours, weights)

    def setup(self):
        # A common starting body (client 0's initial one, as FedAvg's global model): averaging
        # independently initialised networks would mix unaligned features. Peers agree on it through
        # the shared seed, so nothing is sent. Heads keep their own initial weights.
        common = body_state(self.ctx.clients[0].model)
        for client in self.ctx.clients:
            client.model.load_state_dict(common, strict=False)
        for client in self.ctx.clients:  # knowledge of the initial models; sent (and counted) in round 1
            publish(client, self.ctx.num_classes, self.p.T, self.ctx.params.train.eval_batch_size)
            self.soft[client.id], self.counts[client.id] = client.state["soft"], client.state["counts"]
        self.topology.write(self.ctx.run_dir / "topology.json")
        return {}

    def configure(self, round_, selected):
        """Step 1: what every in-neighbour sends each selected client, from the round-start state."""
        neighbours = self.topology.in_neighbours(round_)
        senders = sorted(set(selected) | {int(j) for i in selected for j in neighbours[i]})
        bodies = {j: body_state(self.ctx.clients[j].model) for j in senders}  # the round-start snapshot
        downloads = {}
        for i in selected:
            downloads[i] = []
            for j in (int(j) for j in neighbours[i]):  # what travels over the edge j -> i
                downloads[i] += [Payload("body", bodies[j], sender=j),
                                 Payload("knowledge", {"soft": self.soft[j].clone(), "counts": self.counts[j].clone()},
                                         sender=j)]
        self.stats[round_] = {"edges": float(sum(len(neighbours[i]) for i in selected))}
        return downloads

    def aggregate(self, round_, uploads):
        maxima = []
        for i, up in uploads.items():
            self.soft[i], self.counts[i] = up.kept["soft"], up.kept["counts"]
            w = up.kept["weights"]
            self.last_weights[i] = (self.ctx.clients[i].state["neighbours"].tolist(), w.tolist())
            maxima.append(float(w.max()))
        self.stats[round_]["attention_max"] = sum(maxima) / max(len(maxima), 1)

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
