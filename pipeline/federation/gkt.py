"""The skeleton FedDKC and FedICT share: FedGKT-style knowledge transfer with a server model.

Each client's model splits at its stem: the stem's 16-channel feature maps are what the
server model A4^S (models/server.py) reads. One round, for every selected client:
  1. download the server's logits for each of its training samples (none in the first round);
  2. train one local epoch on CE + beta * (the method's distillation term toward those logits);
  3. upload, for every training sample, its stem features, its logits and its label, from one
     extra forward pass in eval mode after training (as FedGKT's clients do).
The server then trains A4^S for `server_epochs` epochs over this round's uploads, shuffled
across clients, on ce_weight * CE + (the method's distillation term toward each sample's client
logits; both official codes weight CE by their `alpha`, not the distillation term),
and keeps the logits A4^S produced for each sample while training (FedGKT's choice: no extra
pass) as the knowledge it sends back next round.

The methods differ only in the two distillation terms: `client_kd_rows` and `server_kd_rows`.

Bytes, per selected client of n samples with H x W images and C classes:
  up   = n * (16*H*W*4 + C*4 + 8)   float32 features, float32 logits, int64 labels
  down = n * C*4                    float32 server logits (from the second round on)
`<method>.encode_up` encodes the features and the logits (float32, float16, int8 or top-k; the labels
travel as they are), `<method>.encode_down` the server's logits (those, or argmax), per row: a sample's
logits, a sample's channel's H x W feature map (int8 has a minimum and a step per map; top-k keeps a
map's values largest in magnitude, the others decode to 0, and a logits row's largest, the others to
their log-mean-exp). The ledger counts the encoded parts (pipeline/encoding_spec.py: 4 bytes a value
becoming the encoding's bytes a row), and each side decodes before use.

Departure: FedGKT keeps every client's latest upload and trains on all of them each round; here
the server trains on the uploads of the round. With full participation (the paper's setting)
the two are the same, and a checkpoint then holds no client features.
"""

from __future__ import annotations

import torch

from models.server import build_server_model
from pipeline.encoding_spec import Spec
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.clients import Client
from pipeline.federation.clock import forward_flops
from pipeline.federation.contract import LocalUpdate, Server, ServerContext, Upload, Wire
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows
from pipeline.seeds import torch_generator


@torch.no_grad()
def stem_features_and_logits(model, x: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One eval-mode pass of a client ResNet: (stem features [n,16,H,W], logits [n,C]), float32 on CPU."""
    model.eval()
    feats, logits = [], []
    for start in range(0, len(x), batch_size):
        f = model.stem(x[start:start + batch_size])
        feats.append(f.float().cpu())
        logits.append(model.head(model.pooled(f)).float().cpu())
    return torch.cat(feats), torch.cat(logits)


def codes(params, method: str) -> tuple[Spec, Spec]:
    """The method's (encode_up, encode_down) from its params section."""
    section = getattr(params, method)
    return parse_encoding(section.encode_up), parse_encoding(section.encode_down)


def encode_upload(spec: Spec, features: torch.Tensor, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """The parts of a client's features [n, c, H, W] and logits [n, C]: a row per feature map, a row per sample
    (a top-k keeps a feature map's values largest in magnitude: they are activations, not scores)."""
    return {**encode(spec, "features", features.flatten(2).flatten(0, 1), fill="zero").parts,
            **encode(spec, "logits", logits).parts}


def decode_upload(spec: Spec, arrays: dict[str, torch.Tensor], feature_shape: tuple[int, ...],
                  num_classes: int) -> dict[str, torch.Tensor]:
    """The server's side of `encode_upload`: features [n, *feature_shape], logits [n, C] and the labels."""
    labels = arrays["labels"]
    features = decode(spec, "features", arrays, columns=feature_shape[1] * feature_shape[2], fill="zero")
    return {"features": features.reshape(len(labels), *feature_shape),
            "logits": decode(spec, "logits", arrays, columns=num_classes), "labels": labels}


def label_distribution(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[C] share of each class among `labels` (float32)."""
    counts = torch.bincount(labels.cpu(), minlength=num_classes).float()
    return counts / counts.sum()


class GKTClient(LocalUpdate):
    """The client half: distil the server's per-sample logits, then upload features and logits."""

    method = ""  # the subclass's params section: its beta, the weight of the distillation term, and its encodings

    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.beta = getattr(params, self.method).beta
        self.up, self.down = codes(params, self.method)

    def targets(self, client: Client) -> dict[str, torch.Tensor]:
        """Extra per-sample targets the distillation term needs (FedICT: the client's label prior)."""
        return {}

    def client_kd_rows(self, logits: torch.Tensor, step) -> torch.Tensor:
        """The per-row distillation term toward step.t["teacher"] (NaN rows: no teacher yet -> 0)."""
        raise NotImplementedError

    def begin(self, client, download, round_):
        teacher = torch.full((client.num_train, self.num_classes), float("nan"))
        for p in download:
            teacher = decode(self.down, "logits", p.arrays, columns=self.num_classes)
        return {"teacher": teacher.to(client.y_train.device), **self.targets(client)}

    def loss(self, model, step, phase):
        logits = model(step.x)
        return ce_rows(logits, step.y) + self.beta * self.client_kd_rows(logits, step)

    def end(self, client, targets, records, round_):
        feats, logits = stem_features_and_logits(client.model, client.x_train, self.params.train.eval_batch_size)
        return Upload([Payload("features", {**encode_upload(self.up, feats, logits),
                                            "labels": client.y_train.cpu().long()})])


class GKTServer(Server):
    """The server half: train A4^S on the round's uploads and keep its logits as the next download."""

    def __init__(self, ctx: ServerContext, server_model: str, epochs: int, batch_size: int | None,
                 ce_weight: float = 1.0):
        super().__init__(ctx)
        t = ctx.params.train
        self.epochs = epochs
        self.ce_weight = ce_weight
        self.batch_size = batch_size or t.batch_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch_generator(ctx.params.seed, "server_model").initial_seed()))
            self.model = build_server_model(ctx.num_classes, server_model).to(ctx.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=t.lr, momentum=t.momentum,
                                         weight_decay=t.weight_decay)
        self.knowledge: dict[int, torch.Tensor] = {}  # client -> server logits of its training samples
        self.model_flops: dict[tuple[int, ...], float] = {}  # A4^S's forward FLOPs per sample, by feature shape
        self.train_acc = float("nan")  # A4^S on the round's uploads, while it trained
        self.up, self.down = codes(ctx.params, self.name)
        self.feature_shapes: dict[int, tuple[int, ...]] = {}  # client -> its stem's output for one sample [c, H, W]

    def feature_shape(self, k: int) -> tuple[int, ...]:
        """One sample's stem features [c, H, W] as client k's model makes them (what an upload's rows rebuild)."""
        if k not in self.feature_shapes:
            with torch.no_grad():
                stem = self.ctx.initial_model(k).stem
                self.feature_shapes[k] = tuple(stem(torch.zeros(1, *self.ctx.input_shape, device=self.ctx.device)
                                                    ).shape[1:])
        return self.feature_shapes[k]

    def wire(self, k):
        """Per training sample: up its c stem feature maps of H x W values and its C logits as encode_up sends a row
        of each, and its label (int64); down the server's C logits as encode_down sends a row."""
        n, C = len(self.ctx.client_sample_ids(k)), self.ctx.num_classes
        c, H, W = self.feature_shape(k)
        return {("up", "features"): Wire(c * row_bytes(self.up, H * W, fill="zero") + row_bytes(self.up, C) + 8, n),
                ("down", "server_logits"): Wire(row_bytes(self.down, C), n)}

    def server_kd_rows(self, out: torch.Tensor, client_logits: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        """The per-row distillation term of A4^S's outputs toward the uploading clients' logits."""
        raise NotImplementedError

    def begin_aggregate(self, uploads: dict[int, dict[str, torch.Tensor]]) -> None:
        """Server-side statistics of the round's uploads a distillation term needs (FedICT: label shares)."""

    def configure(self, round_, selected):
        return {k: [Payload("server_logits", encode(self.down, "logits", self.knowledge[k].clone()).parts)]
                if k in self.knowledge else [] for k in selected}

    def aggregate(self, round_, uploads):
        arrays = {k: decode_upload(self.up, up.payloads[0].arrays, self.feature_shape(k), self.ctx.num_classes)
                  for k, up in sorted(uploads.items())}
        self.begin_aggregate(arrays)
        feats = torch.cat([a["features"] for a in arrays.values()])
        labels = torch.cat([a["labels"] for a in arrays.values()])
        client_logits = torch.cat([a["logits"] for a in arrays.values()])
        owner = torch.cat([torch.full((len(a["labels"]),), k) for k, a in arrays.items()])
        produced = torch.empty_like(client_logits)
        shape = tuple(feats.shape[1:])
        if shape not in self.model_flops:
            self.model_flops[shape] = forward_flops(self.model, shape)
        self.count_work(self.epochs * len(labels) * 3 * self.model_flops[shape])  # training: 3 forward passes a sample
        dev, dtype = self.ctx.device, next(self.model.parameters()).dtype  # float32 travels; the model's own dtype trains
        self.model.train()
        for epoch in range(self.epochs):
            order = torch.randperm(len(labels), generator=torch_generator(self.ctx.params.seed, "server_batches",
                                                                         round_, epoch))
            for rows in torch.split(order, self.batch_size):
                out = self.model(feats[rows].to(dev, dtype))
                y = labels[rows].to(dev)
                loss = self.ce_weight * ce_rows(out, y) + self.server_kd_rows(out, client_logits[rows].to(dev, dtype), owner[rows].to(dev))
                self.optimizer.zero_grad(set_to_none=True)
                loss.mean().backward()
                self.optimizer.step()
                produced[rows] = out.detach().float().cpu()
        self.train_acc = float((produced.argmax(1) == labels).float().mean())
        for k in arrays:
            self.knowledge[k] = produced[owner == k].clone()

    def report(self, round_, evaluations):
        rows, _ = super().report(round_, evaluations)
        return rows, {"server_train_acc": self.train_acc}

    def state_dict(self) -> dict:
        return {"model": {n: t.detach().cpu().clone() for n, t in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict(),
                "knowledge": {k: v.clone() for k, v in self.knowledge.items()},
                "train_acc": self.train_acc}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.knowledge = {k: v.clone() for k, v in state["knowledge"].items()}
        self.train_acc = state["train_acc"]
