"""FD (federated distillation): class-level logits.

Each selected client receives, for every class it holds, the mean logits of that class over
the *other* clients that hold it (leave-one-out, from their latest uploads at round start),
trains one local epoch on CE + gamma * CE(softmax(teacher), softmax(student)) for samples
whose class has a teacher, and uploads the mean logits of its samples per class, accumulated
during that epoch (as FD does, at no extra forward pass).

Bytes: up = c*8 (int64 class ids) + c*C*4 (float32 means); down = c'*8 + c'*C*4 for the c'
held classes that have a teacher. `fd.encode_up` and `fd.encode_down` encode the means and the
teachers, a row per class (pipeline/encoding_spec.py; the class ids travel as they are): the
ledger counts the encoded parts, C*4 becoming the encoding's bytes a row, and each side decodes
before use.
"""

from __future__ import annotations

import torch

from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.contract import LocalUpdate, Server, ServerContext, Upload, Wire
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows, soft_ce_rows


def leave_one_out(sums: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
    """sums [K, C, C] (client k's mean logits for class c, zero where not held), held [K, C] bool
    -> [K, C, C] mean over the other clients holding each class; NaN where none does."""
    total = sums.sum(dim=0, keepdim=True) - sums
    count = held.sum(dim=0, keepdim=True) - held.long()
    return total / count.unsqueeze(-1)  # 0/0 -> NaN: no other client holds the class


def classes_held(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[C] bool: the classes present among a client's training labels."""
    held = torch.zeros(num_classes, dtype=torch.bool)
    held[labels.cpu().unique()] = True
    return held


class FDClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.up, self.down = parse_encoding(params.fd.encode_up), parse_encoding(params.fd.encode_down)

    def begin(self, client, download, round_):
        C = self.num_classes
        table = torch.full((C, C), float("nan"), dtype=torch.float32)  # class logits as float32 decodes them
        for p in download:
            table[p.arrays["class_ids"]] = decode(self.down, "logits", p.arrays, columns=C)
        return {"teacher": table.to(client.y_train.device)[client.y_train]}  # each sample's class teacher

    def loss(self, model, step, phase):
        logits = model(step.x)
        step.record("logits", logits)
        return ce_rows(logits, step.y) + self.params.fd.gamma * soft_ce_rows(logits, step.t["teacher"])

    def end(self, client, targets, records, round_):
        """Per held class, the mean of the logits its samples had while training (no extra forward pass)."""
        idx, logits = records["logits"]
        y = client.y_train[idx.to(client.y_train.device)]
        C = self.num_classes
        sums = torch.zeros(C, C, device=logits.device).index_add_(0, y, logits)
        counts = torch.bincount(y, minlength=C)
        mine = torch.nonzero(counts > 0).flatten()
        means = (sums[mine] / counts[mine].unsqueeze(1)).float().cpu()  # float32, then encoded
        return Upload([Payload("class_logits", {"class_ids": mine.cpu(), **encode(self.up, "logits", means).parts})])


class FD(Server):
    name = "fd"
    client_cls = FDClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx)
        K, C = ctx.num_clients, ctx.num_classes
        # the server's view: each client's latest per-class mean logits, and the classes each client has
        # (which a client announces; read from the data layout, so it holds before a client's first upload)
        self.means = torch.zeros(K, C, C, dtype=torch.float32)
        self.held = torch.zeros(K, C, dtype=torch.bool)
        self.classes = [classes_held(ctx.client_labels(k), C) for k in range(K)]
        self.up, self.down = parse_encoding(ctx.params.fd.encode_up), parse_encoding(ctx.params.fd.encode_down)

    def wire(self, k):
        """Per held class: its id (int64) and a row of C logits, as the direction's encoding sends one."""
        C, held = self.ctx.num_classes, int(self.classes[k].sum())
        return {("up", "class_logits"): Wire(8 + row_bytes(self.up, C), held),
                ("down", "class_logits"): Wire(8 + row_bytes(self.down, C), held, False)}

    def configure(self, round_, selected):
        teachers = leave_one_out(self.means, self.held)  # from uploads as of round start
        self.count_work(3.0 * self.means.numel())  # the leave-one-out means: the sum, less each own, divided
        downloads = {}
        for k in selected:
            classes = torch.nonzero(~torch.isnan(teachers[k, :, 0]) & self.classes[k]).flatten()
            downloads[k] = []
            if len(classes):  # indexing copied the rows
                sent = encode(self.down, "logits", teachers[k, classes]).parts
                downloads[k].append(Payload("class_logits", {"class_ids": classes, **sent}))
        return downloads

    def aggregate(self, round_, uploads):
        for k, up in uploads.items():
            arrays = up.payloads[0].arrays
            self.means[k].zero_()
            self.held[k].zero_()
            self.means[k, arrays["class_ids"]] = decode(self.up, "logits", arrays, columns=self.ctx.num_classes)
            self.held[k, arrays["class_ids"]] = True

    def state_dict(self) -> dict:
        return {"means": self.means.clone(), "held": self.held.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.means.copy_(state["means"])
        self.held.copy_(state["held"])
