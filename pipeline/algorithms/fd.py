"""FD (federated distillation): class-level logits.

Each selected client receives, for every class it holds, the mean logits of that class over
the *other* clients that hold it (leave-one-out, from their latest uploads at round start),
trains one local epoch on CE + gamma * CE(softmax(teacher), softmax(student)) for samples
whose class has a teacher, and uploads the mean logits of its samples per class, accumulated
during that epoch (as FD does, at no extra forward pass).

Bytes: up = c*8 (int64 class ids) + c*C*4 (float32 means); down = c'*8 + c'*C*4 for the c'
held classes that have a teacher.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.algorithms.base import Algorithm
from pipeline.comm import DOWN, UP, Payload
from pipeline.engine import Context


def leave_one_out(sums: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """sums [K, C, C] (client k's mean logits for class c, zero where not held), held [K, C] bool
    -> [K, C, C] mean over the other clients holding each class; NaN where none does."""
    total = sums.sum(dim=0, keepdim=True) - sums
    count = held.sum(dim=0, keepdim=True) - held.long()
    return total / count.unsqueeze(-1)  # 0/0 -> NaN: no other client holds the class


def soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """CE(softmax(teacher), softmax(student)) over rows with a teacher (NaN rows skipped), / batch size."""
    has = ~torch.isnan(teacher[:, 0])
    if not bool(has.any()):
        return student.new_zeros(())
    return -(F.softmax(teacher[has], dim=1) * F.log_softmax(student[has], dim=1)).sum() / len(student)


class FD(Algorithm):
    name = "fd"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        K, C = len(ctx.clients), ctx.num_classes
        self.gamma = ctx.params.fd.gamma
        # the server's view: each client's latest per-class mean logits
        self.means = torch.zeros(K, C, C)
        self.held = torch.zeros(K, C, dtype=torch.bool)

    def train_round(self, round_: int, selected: list[int]) -> None:
        teachers = leave_one_out(self.means, self.held)  # from uploads as of round start
        C = self.ctx.num_classes
        for k in selected:
            client = self.ctx.clients[k]
            table = torch.full((C, C), float("nan"))
            with self.ctx.timer("exchange"):
                classes = torch.nonzero(~torch.isnan(teachers[k, :, 0]) & client_classes(client, C)).flatten()
                if len(classes):
                    down = self.ctx.ledger.record(round_, k, DOWN, Payload("class_logits", {
                        "class_ids": classes, "logits": teachers[k, classes].clone()}))
                    table[down.arrays["class_ids"]] = down.arrays["logits"]
            table = table.to(self.ctx.device)
            sums = torch.zeros(C, C, device=self.ctx.device)
            counts = torch.zeros(C, device=self.ctx.device)
            client.model.train()
            for x, y, _ in self.ctx.batches(client, round_):
                logits = client.model(x)
                loss = F.cross_entropy(logits, y) + self.gamma * soft_cross_entropy(logits, table[y])
                client.step(loss)
                sums.index_add_(0, y, logits.detach())
                counts.index_add_(0, y, torch.ones_like(y, dtype=counts.dtype))
            with self.ctx.timer("exchange"):
                mine = torch.nonzero(counts > 0).flatten().cpu()
                means = (sums[mine.to(sums.device)] / counts[mine.to(sums.device)].unsqueeze(1)).cpu()
                up = self.ctx.ledger.record(round_, k, UP, Payload("class_logits", {"class_ids": mine, "logits": means}))
                self.means[k].zero_()
                self.held[k].zero_()
                self.means[k, up.arrays["class_ids"]] = up.arrays["logits"]
                self.held[k, up.arrays["class_ids"]] = True

    def state_dict(self) -> dict:
        return {"means": self.means.clone(), "held": self.held.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.means.copy_(state["means"])
        self.held.copy_(state["held"])


def client_classes(client, num_classes: int) -> torch.Tensor:
    """[C] bool: the classes present in a client's training data."""
    held = torch.zeros(num_classes, dtype=torch.bool)
    held[client.y_train.cpu().unique()] = True
    return held
