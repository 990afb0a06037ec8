"""pDFL: personalized decentralized FL -- learned multi-head attention over peers + two-way KD, no server.

The model is split into a shared body (ResNet stem + stages + pooling, i.e. `model.features`)
and a personal head (`model.head`). Clients sit on a peer graph (pipeline/methods/pdfl/topology.py). Nobody
averages parameters: every client keeps its own body and head; peers' models are used only as
teachers (their outputs), and the knowledge flows both ways.

One round t, for every selected client i (all computed from the state at the start of the round,
so the order of clients does not matter):
  1. receive, from every in-neighbour j of round t: j's whole model copy (state_dict at the start of
     the round, BatchNorm buffers included) and j's knowledge (P_j [C, C], the mean softmax(logits/T)
     of j's training samples per class, eval mode, after j's last training, zero rows for classes j
     lacks; its class counts n_j [C]); plus the feedback copies of i's own model that peers
     optimised for i in an earlier round (step 5) and that were not yet delivered;
  2. attention: p_j(x) = softmax(M_j(x)/T) of every neighbour copy on `attention_samples` seeded
     samples of i's own training data (all when null; eval mode, no grad; one forward pass per
     (round, j, i), batched by train.eval_batch_size; only the top_k teachers of step 3 are then
     run on every sample, which bounds the cost of a large neighbourhood). A
     representation is r = (n / sum n)[:, None] * P flattened to C*C (the joint table of label and
     soft prediction), standardised without parameters (zero mean, unit norm). `heads` heads, each with i's own
     learned projections W_q^h, W_k^h [d_h, C*C] (d_h = ceil(C*C / heads)); the weights are
     w_ij = mean_h softmax_j(<W_q^h r_i, W_k^h r_j> / sqrt(d_h)). Before they are used, i trains its
     projections for `attention_steps` Adam steps (`attention_lr`; a fresh Adam each round) on
     -mean_x log(sum_j w_ij p_j(x)[y]) over those samples: the weighting whose mixture
     teacher explains i's own labels best. The projections live in client.state (seeded init of
     std 0.5 / sqrt(C*C), so the first weights are nearly uniform) and persist across rounds; the
     keys are computed from the neighbours' representations, so what is learned carries over to
     a time-varying neighbourhood. `attention: false` -> uniform weights;
  3. internal KD (head phase, body frozen): CE + kd_weight * T^2 * KL(t_int(x) || softmax(student/T))
     with ONE teacher per sample: t_int(x) = sum over the `top_k` highest-weighted neighbours of
     w_ij p_j(x), renormalised over them, then calibrated: where its argmax is not y, the
     probabilities of y and of the argmax are swapped (y becomes the argmax and the target keeps
     the softness of temperature T);
  4. body phase (head frozen): CE + kd_weight * T^2 * KL(t_ext(x) || softmax(student/T)) with
     t_ext(x) = the mean over the feedback copies F that i received of softmax(F(x)/T) on its own
     samples (calibrated as in 3 only with `external_calibrate`, off by default: the paper
     calibrates the internal teacher): the neighbours' domain expertise, fed back, aligns i's shared representation. No
     feedback yet (round 1) or `external_kd: false` -> CE only. Steps 3/4 are the paper's order
     (`order: head_then_body`, the default); `body_then_head` runs 4 before 3;
  5. external KD, outbound (after i's own training): i takes the copies M_j of its
     `external_peers` highest-weighted neighbours and trains each for `external_steps` SGD steps
     (train.lr / momentum / weight_decay, batch train.batch_size, seeded order, train mode) on
     its own data with CE + kd_weight * T^2 * KL(softmax(M_i(x)/T) || M_j-copy(x)/T), i's trained
     model as the teacher. The copy goes back to j: relayed in the upload (Upload.relay, addressed to j),
     delivered by the network simulator (this module's server half; pDFL has no server) in j's next
     download as Payload("feedback", state, sender=i). Only the latest feedback per directed pair is kept;
  6. publish i's new knowledge (P_i, n_i) and its trained model, sent to its neighbours next round
     (relayed in the upload: the network simulator holds what each client published until it travels
     and is counted; no server half reads a client's model). Its diagnostics and attention weights
     travel as the upload's metrics (plain numbers for the report, not traffic).

Ties in a ranking by weight (uniform weights with attention off) go to the lower client id.
Each training phase is one pass (train.local_epochs epochs) over the local data; the first uses
the batch order every method's first pass uses, the second its own seeded order. In the head
phase the body gets no gradient and the model stays in train mode (BatchNorm batch statistics),
as FedRep-style code does.

Round 0 (nothing is sent): every client keeps its own initial model (as local-only training:
nothing is averaged, so the bodies need not start aligned) and publishes its knowledge of it.
Bytes, per directed edge j -> i, on the sender's side (client j, "up", peer i): kind "model" =
nbytes of j's state_dict, "knowledge" = C*C*4 (float32 P) + C*8 (int64 n), both in round t;
"feedback" = nbytes of the optimised copy's state_dict on the edge i -> j (sender i, peer j),
counted when it is delivered, i.e. in the round of j's next download (t + 1 when j takes part).

Encodings (float32 by default, as above): `encode_models` encodes the model states a client relays, its own model
and its feedback copies (float16 or int8 per tensor row, pipeline/federation/averaging.py's encode_state; integer
buffers as they are), `encode_knowledge` its knowledge P (pipeline/encoding_spec.py; the counts travel as they are):
float16 and int8 encode P's rows as probabilities; topk:K and argmax, made for logits, encode log P, so top-k's
dropped classes decode to the mean of their probabilities and argmax to a hard prediction (softmax of the decoded
logits); delta is refused (one payload goes to neighbours that change from round to round: no one receiver's copy
to send a change against). The sender encodes once, the simulator delivers the encoded parts on every edge (and
counts them there), and each receiver decodes before use: the models it runs and optimises, the knowledge its
attention keys are made of (zero rows for classes the sender lacks). Bytes per edge then follow the encoding:
a model's encoded parts, C rows of P encoded (pipeline/federation/encoding.py's row_bytes) + C*8.
The topology is written to <run_dir>/topology.json (per-round edges when time-varying).
Diagnostics (round metrics, means over the selected clients): `student_acc`, the client's own model on its
training samples at the start of the round (as last published); `internal_teacher_acc` and
`external_teacher_acc`, how often each teacher's argmax is the label on those samples, before calibration.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.encoding_spec import Spec
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.averaging import decode_state, encode_state
from pipeline.federation.clients import Client
from pipeline.federation.contract import LocalUpdate, Server, Phase, ServerContext, Upload, Wire, state_bytes
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows, soft_kd_rows
from pipeline.seeds import torch_generator
from pipeline.methods.pdfl.topology import Topology

State = dict[str, torch.Tensor]
ATTENTION = "attention<-"  # a metric of the upload: the client's weight on neighbour j, named ATTENTION + j


def model_state(model: torch.nn.Module) -> State:
    """A detached copy of the whole state_dict (what travels as a model copy)."""
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


# -- what travels between peers, encoded (pdfl.encode_models, pdfl.encode_knowledge) ---------------------------

LOG_SPACE = ("topk", "argmax")  # encodings made for logits: P's rows travel as log P


def encode_model(spec: Spec, state: State) -> State:
    """A model state as it travels: as it is in float32, else every floating tensor's rows encoded."""
    return state if spec.lossless else encode_state(spec, state)[0]


def decode_model(spec: Spec, arrays: State, template: State) -> State:
    """The receiver's side: `template` (the receiver's own state: one architecture for all) gives names and shapes."""
    return arrays if spec.lossless else decode_state(spec, arrays, template)


def encode_knowledge(spec: Spec, soft: torch.Tensor, counts: torch.Tensor) -> dict[str, torch.Tensor]:
    """P [C, C] encoded, a row per class (as probabilities, or as log P for top-k and argmax), the counts as they
    are. Log P of a class the sender lacks is -inf throughout; the receiver zeroes that row by its count."""
    rows = soft.log() if spec.kind in LOG_SPACE else soft
    return {**encode(spec, "soft", rows).parts, "counts": counts}


def decode_knowledge(spec: Spec, arrays: dict[str, torch.Tensor], num_classes: int) -> dict[str, torch.Tensor]:
    """The receiver's side of encode_knowledge: {"soft": P, "counts": n}, P's rows of absent classes zero."""
    if spec.lossless:
        return arrays
    counts = arrays["counts"]
    soft = decode(spec, "soft", arrays, columns=num_classes).float()
    if spec.kind in LOG_SPACE:  # back to probabilities: top-k's rest keeps its mass, argmax becomes a hard label
        soft = torch.softmax(soft, dim=1)
    return {"soft": torch.where(counts[:, None] > 0, soft, torch.zeros_like(soft)), "counts": counts}


def representations(soft: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """soft [K, C, C], counts [K, C] -> [K, C*C]: label-mix-weighted knowledge (joint label x prediction)."""
    mix = counts.float() / counts.sum(dim=1, keepdim=True).clamp_min(1).float()
    return (mix.unsqueeze(-1) * soft.float()).flatten(1)


def head_dim(D: int, heads: int) -> int:
    return max(1, math.ceil(D / heads))


def init_projections(D: int, heads: int, seed: int, client: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded (W_q, W_k), each [heads, d_h, D], std 0.5 / sqrt(D): scores near 0, weights near uniform."""
    gen = torch_generator(seed, "pdfl-attention", client)
    shape = (heads, head_dim(D, heads), D)
    std = 0.5 / math.sqrt(D)
    return torch.randn(shape, generator=gen) * std, torch.randn(shape, generator=gen) * std


def standardise(r: torch.Tensor) -> torch.Tensor:
    """[..., D] -> zero mean, unit norm over the last dimension (parameter-free)."""
    D = r.shape[-1]
    return F.layer_norm(r, (D,)) / math.sqrt(D)


def attention_weights(query: torch.Tensor, keys: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor) -> torch.Tensor:
    """query [D] (the client's representation), keys [m, D] (its neighbours'), projections [H, d_h, D]
    -> weights [m] (>= 0, summing to one): mean over heads of softmax_j(<W_q r_i, W_k r_j> / sqrt(d_h))."""
    q = torch.einsum("hdk,k->hd", wq, standardise(query.to(wq.dtype)))
    k = torch.einsum("hdk,mk->hmd", wk, standardise(keys.to(wk.dtype)))
    scores = torch.einsum("hd,hmd->hm", q, k) / math.sqrt(wq.shape[1])
    return torch.softmax(scores, dim=1).mean(dim=0)


def mixture_nll(weights: torch.Tensor, fit: torch.Tensor) -> torch.Tensor:
    """-mean_x log(sum_j w_j p_j(x)[y]); fit [m, n] = p_j(x)[y] (NaN counts as 0; log clamped)."""
    mix = (weights.unsqueeze(1) * torch.nan_to_num(fit.to(weights.dtype), nan=0.0)).sum(dim=0)
    return -torch.log(mix.clamp_min(1e-12)).mean()


def train_attention(query: torch.Tensor, keys: torch.Tensor, fit: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                    steps: int, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` Adam steps on mixture_nll of the attention weights; returns the new (W_q, W_k)."""
    wq, wk = wq.detach().clone().requires_grad_(True), wk.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([wq, wk], lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            loss = mixture_nll(attention_weights(query, keys, wq, wk), fit)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return wq.detach(), wk.detach()


def probe_rows(n: int, size: int | None, seed: int, round_: int, client: int) -> torch.Tensor | None:
    """The seeded subset (sorted local indices) of a client's samples its attention is fitted on;
    None: all of them."""
    if size is None or size >= n:
        return None
    gen = torch_generator(seed, "pdfl-attention-samples", round_, client)
    return torch.randperm(n, generator=gen)[:size].sort().values


def ranked(weights: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest weights, ties to the lower index."""
    return torch.argsort(-weights, stable=True)[:k]


def calibrate(teacher: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per row: if the argmax is not y, swap the probabilities of y and of the argmax."""
    rows = torch.arange(len(y), device=teacher.device)
    top = teacher.argmax(dim=1)
    out = teacher.clone()
    top_p, true_p = teacher[rows, top], teacher[rows, y]
    out[rows, top] = true_p
    out[rows, y] = top_p
    return out


def top_k_mixture(probs: torch.Tensor, weights: torch.Tensor, top_k: int) -> torch.Tensor:
    """probs [m, n, C] (neighbours' tempered outputs on the client's samples), weights [m] -> [n, C]:
    sum over the top_k neighbours by weight of w_j p_j(x), renormalised over them."""
    chosen = ranked(weights, top_k)
    w = weights[chosen].to(probs.dtype)
    w = w / w.sum().clamp_min(1e-30)
    return (w[:, None, None] * probs[chosen]).sum(dim=0)


def internal_teacher(probs: torch.Tensor, weights: torch.Tensor, y: torch.Tensor, top_k: int) -> torch.Tensor:
    """The top_k mixture, calibrated (step 3's teacher)."""
    return calibrate(top_k_mixture(probs, weights, top_k), y)


@torch.no_grad()
def soft_outputs(model: torch.nn.Module, x: torch.Tensor, T: float, batch_size: int) -> torch.Tensor:
    """softmax(model(x) / T) [n, C] in eval mode, in batches."""
    model.eval()
    return torch.cat([torch.softmax(model(x[s:s + batch_size]) / T, dim=1) for s in range(0, len(x), batch_size)])


def class_knowledge_from(soft: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample soft outputs [n, C] -> (P [C, C] float32: mean per class, zero rows for absent
    classes; n [C] int64 class counts), on CPU."""
    sums = torch.zeros(num_classes, num_classes, dtype=soft.dtype, device=soft.device).index_add_(0, y, soft)
    counts = torch.bincount(y, minlength=num_classes)
    return (sums / counts.clamp_min(1).unsqueeze(1)).float().cpu(), counts.long().cpu()


@dataclass
class CopyJob:
    """Step 5 for one peer: its model copy, the client's data and its trained model's soft outputs."""

    state: State
    x: torch.Tensor
    y: torch.Tensor
    teacher: torch.Tensor
    gen: torch.Generator

    def batches(self, steps: int, batch_size: int) -> list[torch.Tensor]:
        """The `steps` batches of local indices, each full: a fresh seeded permutation when one runs out."""
        n = len(self.y)
        b = min(batch_size, n)
        perm, pos, out = torch.randperm(n, generator=self.gen), 0, []
        for _ in range(steps):
            if pos + b > n:
                perm, pos = torch.randperm(n, generator=self.gen), 0
            out.append(perm[pos:pos + b])
            pos += b
        return out


def copy_loss(logits: torch.Tensor, y: torch.Tensor, teacher: torch.Tensor, p) -> torch.Tensor:
    """Per row: CE + kd_weight * T^2 * KL(teacher || softmax(logits / T))."""
    return ce_rows(logits, y) + p.kd_weight * soft_kd_rows(logits, teacher, p.T)


def external_copy(scratch: torch.nn.Module, job: CopyJob, params) -> State:
    """Step 5 for one peer: load the peer's copy into `scratch`, train it `external_steps` SGD steps on
    the client's data with copy_loss (a fresh optimizer), return its new state."""
    p, t = params.pdfl, params.train
    scratch.load_state_dict(job.state)
    scratch.train()
    opt = torch.optim.SGD(scratch.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    for idx in job.batches(p.external_steps, t.batch_size):
        idx = idx.to(job.x.device)
        loss = copy_loss(scratch(job.x[idx]), job.y[idx], job.teacher[idx], p)
        opt.zero_grad(set_to_none=True)
        loss.mean().backward()
        opt.step()
    return model_state(scratch)


def external_copies(template: torch.nn.Module, jobs: list[CopyJob], params) -> list[State]:
    """external_copy for every job, as ONE grouped network (models/grouped.py: each copy keeps
    its own weights, BatchNorm statistics and momentum; float rounding aside, the same result). The
    40 copies of a default round train in about 60 % of the time one after another take. A model the
    grouped network cannot express trains one copy after another."""
    from models.grouped import GroupedModel, GroupedSGD, supports

    if supports(template) is not None:
        scratch = copy.deepcopy(template)
        return [external_copy(scratch, job, params) for job in jobs]
    p, t = params.pdfl, params.train
    models = []
    for job in jobs:
        model = copy.deepcopy(template)
        model.load_state_dict(job.state)
        models.append(model)
    grouped = GroupedModel(models)
    grouped.train()
    opt = GroupedSGD(grouped, t.lr, t.momentum, t.weight_decay)  # fresh: no momentum yet, as external_copy
    plans = [job.batches(p.external_steps, t.batch_size) for job in jobs]
    sizes = torch.tensor([len(plan[0]) for plan in plans])
    A, B = len(jobs), int(sizes.max())
    mask = None if bool((sizes == B).all()) else torch.arange(B).unsqueeze(0) < sizes.unsqueeze(1)
    device = jobs[0].x.device
    for s in range(p.external_steps):
        # rows: job a's batch in a*B .. a*B + size_a; a short batch is padded with its first row (masked out)
        idx = [torch.cat([plan[s], plan[s][:1].expand(B - len(plan[s]))]).to(device) for plan in plans]
        x = torch.cat([job.x[i] for job, i in zip(jobs, idx)])
        y = torch.cat([job.y[i] for job, i in zip(jobs, idx)])
        teacher = torch.cat([job.teacher[i] for job, i in zip(jobs, idx)])
        grouped.set_step(A, B, None if mask is None else mask.to(device))
        rows = copy_loss(grouped(x), y, teacher, p).view(A, B)
        if mask is not None:
            rows = rows * mask.to(device, rows.dtype)
        opt.zero_grad()
        (rows.sum(dim=1) / sizes.to(device, rows.dtype)).sum().backward()
        opt.step(A)
    grouped.write_back(models)
    return [model_state(m) for m in models]


def is_head(name: str) -> bool:
    return name.startswith("head.")


def is_body(name: str) -> bool:
    return not is_head(name)


class PDFLClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.pdfl
        self.models_code, self.knowledge_code = parse_encoding(self.p.encode_models), parse_encoding(
            self.p.encode_knowledge)

    def setup(self, client):
        """Round 0: publish the knowledge of the initial model, and the model (sent in round 1)."""
        publish(client, self.num_classes, self.p.T, self.params.train.eval_batch_size)
        return Upload(relay=self.published(client))

    def published(self, client: Client) -> list[Payload]:
        """What a client publishes to its neighbours, encoded once for all of them: its model and its knowledge."""
        return [Payload("model", encode_model(self.models_code, model_state(client.model))),
                Payload("knowledge", encode_knowledge(self.knowledge_code, client.state["soft"], client.state["counts"]))]

    def phases(self, round_):
        head, body = Phase(0, is_head, "head"), Phase(1, is_body, "body")
        if self.p.order == "head_then_body":
            return [head, body]
        return [Phase(0, is_body, "body"), Phase(1, is_head, "head")]

    def extra_samples(self, client, upload, round_):
        """Step 5's training, timed by the simulated clock: each peer copy it optimised (in the upload), external_steps
        batches of min(batch_size, its samples) (CopyJob.batches). Its attention fitting and the peers' forward
        passes are not counted."""
        batch = min(self.params.train.batch_size, client.num_train)
        return sum(p.kind == "feedback" for p in upload.relay) * self.p.external_steps * batch

    def begin(self, client, download, round_):
        """Steps 2-4 on the client: neighbour outputs on its data, train its attention, build the
        internal (top-k, calibrated) and external (feedback) per-sample teachers."""
        p = self.p
        bs = self.params.train.eval_batch_size
        # what the peers relayed, decoded (the client's own state gives the models' names and shapes)
        template, C = client.model.state_dict(), self.num_classes
        models = {m.sender: decode_model(self.models_code, m.arrays, template) for m in download if m.kind == "model"}
        knowledge = {m.sender: decode_knowledge(self.knowledge_code, m.arrays, C) for m in download
                     if m.kind == "knowledge"}
        feedback = sorted(((m.sender, decode_model(self.models_code, m.arrays, template)) for m in download
                           if m.kind == "feedback"), key=lambda f: f[0])
        J = sorted(models)
        x, y = client.x_train, client.y_train
        n = len(y)
        scratch = copy.deepcopy(client.model)

        def outputs(j: int, rows: torch.Tensor | None = None) -> torch.Tensor:
            scratch.load_state_dict(models[j])
            return soft_outputs(scratch, x if rows is None else x[rows], p.T, bs)

        full: dict[int, torch.Tensor] = {}  # j -> p_j(x) on all of i's samples, computed at most once
        if p.attention:
            query = representations(client.state["soft"][None], client.state["counts"][None])[0]
            keys = representations(torch.stack([knowledge[j]["soft"] for j in J]),
                                   torch.stack([knowledge[j]["counts"] for j in J]))
            if "attn_wq" not in client.state:
                client.state["attn_wq"], client.state["attn_wk"] = init_projections(
                    query.numel(), p.heads, self.params.seed, client.id)
            rows = probe_rows(n, p.attention_samples, self.params.seed, round_, client.id)
            probe = []
            for j in J:  # one forward pass per (round, j, i) over the probe samples
                probe.append(outputs(j, None if rows is None else rows.to(x.device)))
                if rows is None:
                    full[j] = probe[-1]
            sub = torch.arange(n) if rows is None else rows
            fit = torch.stack(probe)[:, torch.arange(len(sub), device=x.device), y[sub.to(y.device)]].cpu()
            wq, wk = train_attention(query, keys, fit, client.state["attn_wq"], client.state["attn_wk"],
                                     p.attention_steps, p.attention_lr)
            client.state["attn_wq"], client.state["attn_wk"] = wq, wk
            with torch.no_grad():
                w = attention_weights(query, keys, wq, wk)
        else:
            w = torch.full((len(J),), 1.0 / len(J))
        client.state["neighbours"], client.state["weights"] = torch.tensor(J, dtype=torch.int64), w
        if p.external_kd:
            # kept on the client between begin and end: the peer copies it optimises for them (step 5)
            client.state["held"] = [(J[int(a)], models[J[int(a)]]) for a in ranked(w, p.external_peers)]
        targets = {}
        # diagnostics (round metrics): how often each teacher's argmax is the label, before calibration,
        # next to the client's own model at the start of the round (from its last publish)
        diag = {"student_acc": float(client.state["train_acc"])}
        if p.internal_kd:  # the teacher needs the chosen neighbours' outputs on every sample
            chosen = ranked(w, p.top_k).tolist()
            probs = torch.stack([full[J[a]] if J[a] in full else outputs(J[a]) for a in chosen])
            mixed = top_k_mixture(probs, w[chosen].to(probs.device), len(chosen))
            diag["internal_teacher_acc"] = accuracy(mixed, y)
            targets["internal"] = calibrate(mixed, y)
        if p.external_kd:
            if feedback:
                t_ext = 0
                for _, state in feedback:
                    scratch.load_state_dict(state)
                    t_ext = t_ext + soft_outputs(scratch, x, p.T, bs)
                t_ext = t_ext / len(feedback)
                diag["external_teacher_acc"] = accuracy(t_ext, y)
                targets["external"] = calibrate(t_ext, y) if p.external_calibrate else t_ext
            else:  # NaN rows: no teacher (every client returns the same keys, as the vectorized executor needs)
                targets["external"] = torch.full((n, self.num_classes), float("nan"), dtype=x.dtype,
                                                 device=x.device)
        client.state["diag"] = diag
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
        """Steps 5-6: optimise the chosen peers' copies with i's trained model as teacher (kept for the
        simulator to deliver), publish i's new knowledge (counted when the neighbours receive it)."""
        jobs = self._finish(client, round_)
        scratch = copy.deepcopy(client.model)
        feedback = {j: external_copy(scratch, job, self.params) for j, job in jobs}
        return self._upload(client, feedback)

    def end_all(self, finished, round_):
        """`end` for the round's clients (the vectorized executor): every peer copy they optimise is
        trained in one grouped network (external_copies), the same steps as one after another."""
        owners, jobs = [], []
        for client, _, _ in finished:
            for j, job in self._finish(client, round_):
                owners.append((client.id, j))
                jobs.append(job)
        trained = external_copies(finished[0][0].model, jobs, self.params) if jobs else []
        feedback: dict[int, dict[int, State]] = {client.id: {} for client, _, _ in finished}
        for (i, j), state in zip(owners, trained):
            feedback[i][j] = state
        return {client.id: self._upload(client, feedback[client.id]) for client, _, _ in finished}

    def _finish(self, client, round_) -> list[tuple[int, "CopyJob"]]:
        """Publish i's knowledge of its trained model; the peer copies it is to optimise, (peer, job) each."""
        soft = soft_outputs(client.model, client.x_train, self.p.T, self.params.train.eval_batch_size)
        client.state["soft"], client.state["counts"] = class_knowledge_from(soft, client.y_train, self.num_classes)
        client.state["train_acc"] = torch.tensor(accuracy(soft, client.y_train))  # for the next round's diagnostics
        return [(j, CopyJob(state, client.x_train, client.y_train, soft,
                            torch_generator(self.params.seed, "pdfl-external", round_, client.id, j)))
                for j, state in client.state.pop("held", [])]

    def _upload(self, client, feedback: dict[int, State]) -> Upload:
        """What i relays (its model and knowledge to its neighbours, each feedback copy to its peer) and its
        diagnostics: the round's teacher accuracies and its attention weight on each neighbour."""
        relay = [*self.published(client), *(Payload("feedback", encode_model(self.models_code, state), receiver=j)
                                            for j, state in sorted(feedback.items()))]
        attention = {f"{ATTENTION}{j}": float(w) for j, w in zip(client.state["neighbours"].tolist(),
                                                                  client.state["weights"].tolist())}
        return Upload(relay=relay, metrics={**client.state.pop("diag", {}), **attention})


def publish(client: Client, num_classes: int, T: float, batch_size: int) -> None:
    soft = soft_outputs(client.model, client.x_train, T, batch_size)
    client.state["soft"], client.state["counts"] = class_knowledge_from(soft, client.y_train, num_classes)
    client.state["train_acc"] = torch.tensor(accuracy(soft, client.y_train))


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Share of rows whose argmax is the label."""
    return float((probs.argmax(dim=1) == y).float().mean()) if len(y) else float("nan")


class PDFL(Server):
    name = "pdfl"
    client_cls = PDFLClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx)
        self.p = ctx.params.pdfl
        self.topology = Topology(ctx.num_clients, self.p, ctx.params.seed)  # a ConfigError here, before any training
        # what each client last published, as it travels (encoded): its knowledge and its model (after its last
        # training); the simulator forwards them, it never decodes them
        self.knowledge: dict[int, dict[str, torch.Tensor]] = {}
        self.models: dict[int, State] = {}
        self.models_code, self.knowledge_code = parse_encoding(self.p.encode_models), parse_encoding(
            self.p.encode_knowledge)
        # the network simulator's undelivered feedback: receiver -> sender -> optimised copy (latest only)
        self.feedback: dict[int, dict[int, State]] = {}
        self.stats: dict[int, dict[str, float]] = {}  # round -> extras (diagnostics of the round just trained)
        self.last_weights: dict[int, tuple[list[int], list[float]]] = {}  # client -> (neighbours, weights)

    def wire(self, k):
        """Per directed edge k -> i, on k's side: its model and its knowledge; the feedback copy k
        optimised for i (i's architecture: every client has the same one)."""
        C = self.ctx.num_classes
        model = state_bytes(encode_model(self.models_code, model_state(self.ctx.initial_model(k))))
        knowledge = C * row_bytes(self.knowledge_code, C) + 8 * C  # P's rows encoded, n as int64
        return {("up", "model"): Wire(model), ("up", "knowledge"): Wire(knowledge), ("up", "feedback"): Wire(model)}

    def setup(self, uploads):
        # No common body: nothing is averaged, so every client keeps its own initial model (as local-only).
        for k, up in uploads.items():  # the initial models and their knowledge; sent (and counted) in round 1
            self.hold(k, up.relay)
        self.topology.write(self.ctx.run_dir / "topology.json")

    def hold(self, i: int, relay: list[Payload]) -> None:
        """The network keeps what client i relayed until it travels (and is counted): its model and knowledge,
        sent to its neighbours, and its feedback copies, the latest per directed pair i -> j."""
        for p in relay:
            if p.kind == "model":
                self.models[i] = p.arrays
            elif p.kind == "knowledge":
                self.knowledge[i] = {name: t.clone() for name, t in p.arrays.items()}
            elif p.kind == "feedback":
                self.feedback.setdefault(p.receiver, {})[i] = p.arrays
            else:
                raise ValueError(f"pdfl: client {i} relayed an unknown payload {p.kind!r}")

    def configure(self, round_, selected):
        """Step 1: what every in-neighbour sends each selected client, from the round-start state,
        plus the feedback waiting for it."""
        neighbours = self.topology.in_neighbours(round_)
        senders = sorted({int(j) for i in selected for j in neighbours[i]})
        models = {j: self.models[j] for j in senders}  # as published: the round-start state
        downloads, delivered = {}, 0
        for i in selected:
            downloads[i] = []
            for j in (int(j) for j in neighbours[i]):  # what travels over the edge j -> i
                downloads[i] += [Payload("model", models[j], sender=j),
                                 Payload("knowledge", {n: t.clone() for n, t in self.knowledge[j].items()}, sender=j)]
            for s, state in sorted(self.feedback.pop(i, {}).items()):  # optimised for i by s in an earlier round
                downloads[i].append(Payload("feedback", state, sender=s))
                delivered += 1
        self.stats[round_] = {"edges": float(sum(len(neighbours[i]) for i in selected)),
                              "feedback_delivered": float(delivered)}
        return downloads

    def aggregate(self, round_, uploads):
        stats = self.stats.setdefault(round_, {})
        maxima = []
        for i, up in sorted(uploads.items()):
            self.hold(i, up.relay)
            weights = {int(key.removeprefix(ATTENTION)): w for key, w in up.metrics.items() if key.startswith(ATTENTION)}
            self.last_weights[i] = (list(weights), list(weights.values()))
            for j, wj in weights.items():
                stats[f"attn:{i}<-{j}"] = wj
            maxima.append(max(weights.values()))
        stats["attention_max"] = sum(maxima) / max(len(maxima), 1)
        # mean over the clients that had each teacher this round (diagnostics: is a teacher ahead of the student?)
        for key in ("student_acc", "internal_teacher_acc", "external_teacher_acc"):
            values = [up.metrics[key] for up in uploads.values() if not math.isnan(up.metrics.get(key, float("nan")))]
            if values:
                stats[key] = sum(values) / len(values)

    def report(self, round_, evaluations):
        rows, _ = super().report(round_, evaluations)
        return rows, dict(self.stats.get(round_, {}))

    def end_round(self, round_: int) -> None:
        self.topology.write(self.ctx.run_dir / "topology.json")
        self.stats = {r: s for r, s in self.stats.items() if r == round_}

    def state_dict(self) -> dict:
        return {"knowledge": {i: dict(k) for i, k in self.knowledge.items()}, "topology": self.topology.state_dict(),
                "models": dict(self.models), "feedback": {j: dict(by) for j, by in self.feedback.items()}}

    def load_state_dict(self, state: dict) -> None:
        if "knowledge" in state:
            self.knowledge = {int(i): dict(k) for i, k in state["knowledge"].items()}
        else:  # a checkpoint from before the encodings: every client's float32 knowledge in two tables
            self.knowledge = {i: {"soft": s.clone(), "counts": n.clone()}
                              for i, (s, n) in enumerate(zip(state["soft"], state["counts"]))}
        self.topology.load_state_dict(state["topology"])
        self.models = {int(k): m for k, m in state["models"].items()}
        self.feedback = {int(j): {int(i): s for i, s in by.items()} for j, by in state["feedback"].items()}
