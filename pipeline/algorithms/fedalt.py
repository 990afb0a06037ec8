"""FedAlt: partial block-wise models with block-level self-distillation.

The model is the multi-exit ResNet-20 of models/multiexit.py (M = 3 blocks, each with its
own exit), fixed by the method whatever `train.model` says; every client's model is replaced
by it here, all from one seeded initialization (the initial global model). Homogeneous only.

One round, for each selected client k:
  1. distribution: the server sends the first m_k blocks of the global model (parameters, BN
     buffers and the blocks' exits), m_k = tiers[k mod len(tiers)], or with `vary_tiers` a
     seeded draw from `tiers` per (round, client); on rounds where round % tau == 0 it sends
     the whole model (m_k = M);
  2. combination: the client overwrites its first m_k blocks with them and keeps its own later
     blocks (a full-model round replaces everything); the SGD momentum of overwritten
     parameters is dropped, the rest of the optimizer state is kept;
  3. local training, one pass over the client's batches (pipeline/clients.py: batch_order), on
        CE(final, y) + sum_exits [CE(exit, y) + lambda * T^2 * KL(softmax(final/T) || softmax(exit/T))]
     with the final output detached as the teacher;
  4. upload: the blocks it received, after training.
The server then averages every block over the clients that uploaded it, weighted by their
sample counts; a block nobody uploaded keeps its global value.

Bytes: one payload per block per direction, ledger kinds "block1", "block2", "block3"
(the nbytes of that block's state_dict tensors, num_batches_tracked included).

Accuracy: each client's own (combined, trained) model, final exit, on its own test split;
the per-exit means are stored as round metrics `acc_exit1`, `acc_exit2`, `acc_exit3`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

from models.multiexit import NUM_BLOCKS, block_of, block_state, build_multiexit
from pipeline.algorithms.base import LocalUpdate, Method, Upload
from pipeline.algorithms.fedavg import weighted_average
from pipeline.clients import Context
from pipeline.comm import Payload
from pipeline.losses import ce_rows, kd_rows
from pipeline.seeds import rng, torch_generator

if TYPE_CHECKING:
    from pipeline.config import FedAltParams


def blocks_sent(cfg: FedAltParams, seed: int, round_: int, client: int) -> int:
    """m_k: how many leading blocks client k receives (and uploads) in a round."""
    if round_ % cfg.tau == 0:
        return NUM_BLOCKS
    if cfg.vary_tiers:
        return int(cfg.tiers[int(rng(seed, "fedalt_tiers", round_, client).integers(len(cfg.tiers)))])
    return int(cfg.tiers[client % len(cfg.tiers)])


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


def fedalt_loss_rows(outputs: list[torch.Tensor], y: torch.Tensor, lam: float, T: float) -> torch.Tensor:
    """Per row: CE on the final output + CE on every exit + lambda * self-distillation of every exit
    toward the (detached) final output."""
    final = outputs[-1]
    rows = ce_rows(final, y)
    for out in outputs[:-1]:
        rows = rows + ce_rows(out, y)
        if lam:
            rows = rows + lam * kd_rows(out, final.detach(), T)
    return rows


class FedAltClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.cfg = params.fedalt

    def begin(self, client, download, round_):
        """Combination: overwrite the received blocks, keep the rest; drop stale momentum of replaced weights."""
        received = {}
        for p in download:
            received.update(p.arrays)
        combine(client.model, received)
        m = len(download)
        for name, param in client.model.named_parameters():
            if block_of(name) <= m:
                client.optimizer.state.pop(param, None)
        client.state["blocks"] = torch.tensor(m)
        return {}

    def loss(self, model, step, phase):
        return fedalt_loss_rows(model.forward_all(step.x), step.y, self.cfg.lambda_, self.cfg.T)

    def end(self, client, targets, records, round_):
        """Upload the blocks it received, after training."""
        state = client.model.state_dict()
        m = int(client.state["blocks"])
        return Upload([Payload(f"block{b}", {n: t.detach().cpu().clone() for n, t in block_state(state, b).items()})
                       for b in range(1, m + 1)], {"weight": float(client.num_train)})


class FedAlt(Method):
    name = "fedalt"
    homogeneous_only = True
    client_cls = FedAltClient

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        p = ctx.params
        self.cfg = p.fedalt
        in_channels = ctx.clients[0].x_train.shape[1]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch_generator(p.seed, "init", 0).initial_seed()))
            model = build_multiexit(in_channels, ctx.num_classes)
        self.global_state = {n: t.detach().clone() for n, t in model.state_dict().items()}
        for client in ctx.clients:  # every client starts from the one global model
            client.model = copy.deepcopy(model).to(ctx.device)
            client.new_optimizer()

    def configure(self, round_, selected):
        """Distribution: the first m_k blocks of the global model to each selected client."""
        return {k: [Payload(f"block{b}", block_state(self.global_state, b))
                    for b in range(1, blocks_sent(self.cfg, self.ctx.params.seed, round_, k) + 1)]
                for k in selected}

    def aggregate(self, round_, uploads):
        self.global_state = aggregate(self.global_state, [
            ({int(p.kind.removeprefix("block")): p.arrays for p in up.payloads}, up.kept["weight"])
            for up in uploads.values()])

    @torch.inference_mode()
    def evaluate(self, round_: int):
        """Rows from the final exit (what model(x) returns); per-exit mean accuracies as extras."""
        bs = self.ctx.params.train.eval_batch_size
        rows, per_exit = [], [[] for _ in range(NUM_BLOCKS)]
        for c in self.ctx.clients:
            c.model.eval()
            correct = torch.zeros(NUM_BLOCKS, dtype=torch.long, device=c.y_test.device)
            for start in range(0, len(c.y_test), bs):
                y = c.y_test[start : start + bs]
                outs = c.model.forward_all(c.x_test[start : start + bs])
                correct += torch.stack([(o.argmax(dim=1) == y).sum() for o in outs])
            n = len(c.y_test)
            accs = (correct.cpu().double() / n).tolist() if n else [float("nan")] * NUM_BLOCKS
            rows.append((c.id, accs[-1], n))
            for i, a in enumerate(accs):
                per_exit[i].append(a)
        extras = {f"acc_exit{i + 1}": sum(a) / len(a) for i, a in enumerate(per_exit)}
        return rows, extras

    def state_dict(self) -> dict:
        return {"global": {n: t.clone() for n, t in self.global_state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}
