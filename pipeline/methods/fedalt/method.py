"""FedAlt: partial block-wise models with block-level self-distillation.

The model is the multi-exit ResNet-20 of models/multiexit.py (M = 3 blocks, each with its
own exit), fixed by the method whatever `train.model` says; every client's model is replaced
by it here, all from one seeded initialization (the initial global model). Homogeneous only.

One round r, for each selected client k:
  1. distribution: on rounds that are multiples of tau+1 the server sends every client the
     whole global model; on the other rounds it sends client k the first m_k blocks
     (parameters, BN buffers and the blocks' exits), m_k from the client's capacity:
       compute tier c_k in {1, 2, 3}: drawn once per client from `capacity` (seeded stream
           "fedalt_capacity" per client), the blocks it can train with the global model;
       link: congested in round r with probability `congestion` (seeded stream "fedalt_link"
           per (round, client)), which costs one block: m_k = max(1, c_k - 1); else m_k = c_k.
     (The paper writes m = 0 for "the whole model" and m in 1..M-1 otherwise; here m = M.)
  2. combination: the client overwrites its first m_k blocks with them and keeps its own later
     blocks (a full-model round replaces everything); the SGD momentum of overwritten
     parameters is dropped, the rest of the optimizer state is kept;
  3. local training, one pass over the client's batches (pipeline/federation/clients.py: batch_order), on
        CE(final, y) + sum_exits [CE(exit, y) + lambda_r * SD(exit, final)]
     with SD the block-level self-distillation (T^2-scaled KL at temperature T):
        two_way: KL(final/T || exit/T) with the final output detached (trains the exit) +
                 KL(exit/T || final/T) with the exit detached (trains the final output);
        one_way: only the first term.
     lambda_r = lambda * min(1, r / distill_warmup) (just lambda when distill_warmup = 0);
  4. upload: its whole trained local model, all 3 blocks, every round (the paper's x_k^t).
The server then averages every block over the clients that uploaded it (every selected
client), weighted by their sample counts; a block nobody uploaded keeps its global value.

Bytes: one payload per block per direction, ledger kinds "block1", "block2", "block3"
(the nbytes of that block's state_dict tensors, num_batches_tracked included).

Encodings (`fedalt.encode_down`, `fedalt.encode_up`; pipeline/federation/averaging.py): the blocks sent down
travel as float32, float16 or int8 per tensor row; with an encoding up other than float32 a client uploads each
block as its change from what it started the round from (the block as it decoded it from the download, or its own
block as it stood for a block it was not sent), encoded (float16, int8, or topk:F of each tensor), adding what its
earlier uploads' encoding left out (error feedback, with every encoding up: the server holds a block the client
keeps only as it rebuilt it from the client's uploads, so an error not carried forward would stay in it). The
server rebuilds each client's model from the blocks it sent it this round, as decoded, and its copy of the client's
other blocks (the initial model's before the client's first upload), and keeps that copy (checkpointed). A lossy
encoding up is refused where the simulated clock can drop an upload (fedalt/params.py): the copies would part.

Accuracy: each client's own (combined, trained) model, final exit, on its own test split;
the per-exit means are stored as round metrics `acc_exit1`, `acc_exit2`, `acc_exit3`, and the
global model's (final exit) mean accuracy over the clients' test splits as `acc_global`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from models.multiexit import NUM_BLOCKS, block_of, block_state, build_multiexit
from pipeline.federation.averaging import (decode_state, encode_change, encode_state, state_codes, state_size,
                                           weighted_average)
from pipeline.federation.clients import evaluate_with
from pipeline.federation.contract import (SAMPLE_COUNT, Evaluation, LocalUpdate, Phase, Server, ServerContext, Upload,
                                          Wire, sample_count, weight_of)
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows, kd_rows
from pipeline.seeds import rng, torch_generator

if TYPE_CHECKING:
    from pipeline.methods.fedalt.params import FedAltParams


def full_round(tau: int, round_: int) -> bool:
    """The whole global model goes to every client on rounds that are multiples of tau+1."""
    return round_ % (tau + 1) == 0


def compute_tier(cfg: FedAltParams, seed: int, client: int) -> int:
    """Client k's compute tier (1..M blocks), drawn once from `capacity` on the client's own stream."""
    return int(rng(seed, "fedalt_capacity", client).choice(NUM_BLOCKS, p=cfg.capacity)) + 1


def congested(cfg: FedAltParams, seed: int, round_: int, client: int) -> bool:
    """Whether client k's link is congested in this round (seeded per (round, client))."""
    return bool(rng(seed, "fedalt_link", round_, client).random() < cfg.congestion)


def blocks_sent(cfg: FedAltParams, seed: int, round_: int, client: int) -> int:
    """m_k: how many leading blocks client k receives in a round (NUM_BLOCKS: the whole model)."""
    if full_round(cfg.tau, round_):
        return NUM_BLOCKS
    tier = compute_tier(cfg, seed, client)
    return max(1, tier - 1) if congested(cfg, seed, round_, client) else tier


def distill_weight(cfg: FedAltParams, round_: int) -> float:
    """lambda in this round: ramped linearly over the first `distill_warmup` rounds (if any)."""
    if cfg.distill_warmup:
        return cfg.lambda_ * min(1.0, round_ / cfg.distill_warmup)
    return cfg.lambda_


def combine(model: torch.nn.Module, received: dict[str, torch.Tensor]) -> None:
    """Overwrite the model's tensors of the received blocks (each block complete); keep the rest."""
    blocks = {block_of(n) for n in received}
    own = model.state_dict()
    missing = [n for n in own if block_of(n) in blocks and n not in received]
    if missing:
        raise ValueError(f"incomplete block(s) received, missing {missing[:3]}")
    with torch.no_grad():
        for n, t in received.items():
            own[n].copy_(t)


def aggregate(global_state: dict[str, torch.Tensor], uploads: list[tuple[dict[int, dict[str, torch.Tensor]], float]]
              ) -> dict[str, torch.Tensor]:
    """uploads: (block -> that block's state, weight) per client. Each block becomes the weighted
    mean over the clients that uploaded it; blocks nobody uploaded keep their global value."""
    new = dict(global_state)
    for b in range(1, NUM_BLOCKS + 1):
        states = [(blocks[b], w) for blocks, w in uploads if b in blocks]
        if states:
            new.update(weighted_average([s for s, _ in states], [w for _, w in states]))
    return new


def fedalt_loss_rows(outputs: list[torch.Tensor], y: torch.Tensor, lam: float, T: float,
                     two_way: bool = True) -> torch.Tensor:
    """Per row: CE on the final output + CE on every exit + lambda * self-distillation between
    every exit and the final output (two_way: both directions, each with its teacher detached;
    one_way: the exit toward the detached final output only)."""
    final = outputs[-1]
    rows = ce_rows(final, y)
    for out in outputs[:-1]:
        rows = rows + ce_rows(out, y)
        if lam:
            sd = kd_rows(out, final.detach(), T)
            if two_way:
                sd = sd + kd_rows(final, out.detach(), T)
            rows = rows + lam * sd
    return rows


def initial_multiexit(seed: int, in_channels: int, num_classes: int) -> torch.nn.Module:
    """The one initial model every client and the server start from (seeded like client 0's model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch_generator(seed, "init", 0).initial_seed()))
        return build_multiexit(in_channels, num_classes)


@dataclass(frozen=True)
class DistillPhase(Phase):
    """FedAlt's one training pass, carrying the round's distillation weight to `loss`."""

    lam: float = 0.0


def block_number(kind: str) -> int:
    """The block a payload kind names ("block2" -> 2)."""
    return int(kind.removeprefix("block"))


class FedAltClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.cfg = params.fedalt
        self.codes = state_codes(params, "fedalt")  # (encode_down, encode_up)

    def prepare(self, client):
        """Every client starts from the one global model (the multi-exit network replaces its ResNet)."""
        client.model = initial_multiexit(self.params.seed, client.x_train.shape[1], self.num_classes).to(
            client.x_train.device)
        client.new_optimizer()

    def phases(self, round_):
        return [DistillPhase(lam=distill_weight(self.cfg, round_))]

    def begin(self, client, download, round_):
        """Combination: overwrite the received blocks, keep the rest; drop stale momentum of replaced weights."""
        down, up = self.codes
        own = client.model.state_dict()
        received = {}
        for p in download:
            received.update(p.arrays if down.lossless
                            else decode_state(down, p.arrays, block_state(own, block_number(p.kind))))
        if not up.lossless:  # what its upload's change is from: the blocks received, its own as they stand for the rest
            client.state["base"] = {n: (received[n] if n in received else t).detach().cpu().clone()
                                    for n, t in own.items()}
        combine(client.model, received)
        replaced = {block_of(n) for n in received}
        for name, param in client.model.named_parameters():
            if block_of(name) in replaced:
                client.optimizer.state.pop(param, None)
        return {}

    def loss(self, model, step, phase):
        return fedalt_loss_rows(model.forward_all(step.x), step.y, phase.lam, self.cfg.T,
                                two_way=self.cfg.distill == "two_way")

    def end(self, client, targets, records, round_):
        """Upload the whole trained local model, one payload per block, and the client's sample count."""
        state = client.model.state_dict()
        up = self.codes[1]
        blocks = [{n: t.detach().cpu().clone() for n, t in block_state(state, b).items()}
                  for b in range(1, NUM_BLOCKS + 1)]
        if not up.lossless:  # each block's change, with what earlier uploads left out (see the module docstring)
            blocks = [encode_change(client, up, block, client.state["base"], feedback=True) for block in blocks]
        return Upload([*(Payload(f"block{b}", block) for b, block in enumerate(blocks, 1)),
                       sample_count(client.num_train)])

    @torch.inference_mode()
    def evaluate(self, client, download):
        """Every exit's accuracy ("acc": the final exit, what model(x) returns), and the global
        model's (the evaluation download) as "global"."""
        bs = self.params.train.eval_batch_size
        client.model.eval()
        correct = torch.zeros(NUM_BLOCKS, dtype=torch.long, device=client.y_test.device)
        for start in range(0, len(client.y_test), bs):
            y = client.y_test[start : start + bs]
            outs = client.model.forward_all(client.x_test[start : start + bs])
            correct += torch.stack([(o.argmax(dim=1) == y).sum() for o in outs])
        n = len(client.y_test)
        accs = (correct.cpu().double() / n).tolist() if n else [float("nan")] * NUM_BLOCKS
        readings = {f"exit{i + 1}": a for i, a in enumerate(accs)}
        (global_state,) = download
        readings["global"] = evaluate_with(client, global_state.arrays, bs)
        return Evaluation(n, {"acc": accs[-1], **readings})


class FedAlt(Server):
    name = "fedalt"
    client_cls = FedAltClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx)
        self.cfg = ctx.params.fedalt
        model = initial_multiexit(ctx.params.seed, ctx.in_channels, ctx.num_classes)
        self.global_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
        self.down, self.up = state_codes(ctx.params, self.name)
        # encoded uploads are changes: what each client started the round from, as the server knows it
        self.initial = self.global_state  # every client's model before its first upload (replaced, never changed)
        self.copies: dict[int, dict[str, torch.Tensor]] = {}  # each client's model rebuilt from its last upload
        self.sent: dict[int, dict[str, torch.Tensor]] = {}  # the blocks each selected client decoded this round

    def wire(self, k):
        """Each block as its own kind: the first m_k of them down, all of them up with the sample count; each block
        as its encoding makes a state of its shapes (`state_size`: float32, the nbytes of its tensors)."""
        blocks = [block_state(self.global_state, b) for b in range(1, NUM_BLOCKS + 1)]
        return {**{(direction, f"block{b}"): Wire(state_size(spec, block)) for b, block in enumerate(blocks, 1)
                   for direction, spec in (("down", self.down), ("up", self.up))},
                ("up", SAMPLE_COUNT): Wire(4)}

    def blocks_sent(self, round_: int, client: int) -> int:
        return blocks_sent(self.cfg, self.ctx.params.seed, round_, client)

    def configure(self, round_, selected):
        """Distribution: the first m_k blocks of the global model to each selected client."""
        if self.down.lossless and self.up.lossless:
            return {k: [Payload(f"block{b}", block_state(self.global_state, b))
                        for b in range(1, self.blocks_sent(round_, k) + 1)]
                    for k in selected}
        blocks = {}  # block -> (the parts that travel, what a client decodes of them): encoded once a round
        for b in range(1, NUM_BLOCKS + 1):
            state = block_state(self.global_state, b)
            blocks[b] = (state, state) if self.down.lossless else encode_state(self.down, state)
        m = {k: self.blocks_sent(round_, k) for k in selected}
        if not self.up.lossless:
            self.sent.update({k: {n: t for b in range(1, m[k] + 1) for n, t in blocks[b][1].items()} for k in selected})
        return {k: [Payload(f"block{b}", dict(blocks[b][0])) for b in range(1, m[k] + 1)] for k in selected}

    def uploaded_blocks(self, k: int, upload: Upload) -> dict[int, dict[str, torch.Tensor]]:
        """Client k's blocks from its upload: as they are, or rebuilt from their changes (each added to the block
        k decoded this round, or to the server's copy of k's own block) and kept as the server's copy of k."""
        arrays = {block_number(p.kind): p.arrays for p in upload.payloads if p.kind.startswith("block")}
        if self.up.lossless:
            return arrays
        base = {**self.copies.get(k, self.initial), **self.sent.pop(k)}
        rebuilt = {b: decode_state(self.up, parts, block_state(base, b), base=base) for b, parts in arrays.items()}
        self.copies[k] = {n: t for state in rebuilt.values() for n, t in state.items()}
        return rebuilt

    def aggregate(self, round_, uploads):
        blocks = [self.uploaded_blocks(k, up) for k, up in uploads.items()]
        self.count_work(2.0 * sum(t.numel() for states in blocks for state in states.values() for t in state.values()))
        self.global_state = aggregate(self.global_state, [(states, weight_of(up))
                                                          for states, up in zip(blocks, uploads.values())])

    def evaluation(self, round_):
        return [Payload("global", self.global_state)]

    def report(self, round_, evaluations):
        """Rows from the final exit; per-exit mean accuracies and the global model's as extras."""
        rows = [(k, e.acc["acc"], e.n) for k, e in sorted(evaluations.items())]
        mean = lambda name: sum(e.acc[name] for _, e in sorted(evaluations.items())) / len(evaluations)  # noqa: E731
        extras = {f"acc_exit{i + 1}": mean(f"exit{i + 1}") for i in range(NUM_BLOCKS)}
        extras["acc_global"] = mean("global")
        return rows, extras

    def state_dict(self) -> dict:
        state = {"global": {n: t.clone() for n, t in self.global_state.items()}}
        if not self.up.lossless:  # the sent blocks are folded in by the round's end
            state["copies"] = {k: dict(c) for k, c in self.copies.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}
        self.copies = {int(k): dict(c) for k, c in state.get("copies", {}).items()}
