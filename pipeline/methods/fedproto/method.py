"""FedProto: per-class prototypes (mean penultimate features) instead of parameters or logits.

One round, for each selected client k:
  1. down: the global prototypes the server holds (class ids [c'] int64 + [c', D] float32);
     nothing is sent before the first upload (round 1);
  2. one local epoch on CE(head(f), y) + lambda * MSE(z, P[y]), z = the sample's feature f
     (or adapter(f) with `align`), P[y] the global prototype of its label; samples whose
     label has no global prototype contribute no MSE (the mean runs over B*D, as the
     reference code, which substitutes the sample's own feature there);
  3. an eval-mode pass over its training data: per-class prototypes (`prototype: mean`, or
     the per-class torch.median of the features, `median`: the lower median for an even
     count), class counts and, for `aggregation: confidence`, the classifier's per-class
     accuracy on those same samples;
  4. up: class ids [c] int64, counts [c] int64, prototypes [c, D] float32 (+ accuracies [c]
     float32 for confidence), the prototypes encoded with `encode_up` (below).
After the round, the server aggregates per class over the *latest* upload of every client
that ever uploaded (partial participation works; clients that never did contribute nothing):
  count      weights = class counts (FedProto's weighted mean, the default)
  uniform    every holder of the class counts once
  confidence weights = softmax over the holders of their per-class accuracy (seed's guide).

Evaluation (every client, own test split, one forward pass): accuracy of the local classifier
and of the nearest global prototype (Euclidean, in the prototype space). The round figure
uses `fedproto.eval`; both readings are stored as round metrics acc_classifier /
acc_prototype. Prototype evaluation uses the server's current global prototypes (those
aggregated at the end of this round, as the reference code evaluates); it is measurement,
not traffic, so no bytes are counted for it.

Extensions (each behind a param in params.yaml's fedproto section):
- `prototype: median`: robust prototypes (per-class median instead of mean).
- `aggregation: confidence`: softmax-of-accuracy weights, as above.
- `align`: a feature-alignment adapter Linear(feature_dim, 128)-ReLU-Linear(128, align_dim)
  per client maps its features into a shared prototype space of size align_dim, so clients
  whose feature sizes differ still share prototypes; prototypes, the MSE term and
  prototype-based evaluation then live in that space. The seed's guide puts the adapter on
  the server, but a server has no data to train it on; here each client owns its adapter and
  trains it jointly with its model (the adapter is a submodule `adapter` of the client's model,
  so its own optimizer and checkpoint cover it) through the MSE term toward the global
  prototypes. All adapters start from one seeded initialisation (the second layer is
  identical on every client; the first is identical among clients with equal feature_dim),
  so the clients' aligned spaces start out compatible. The adapter never leaves the client:
  no bytes for it.

Encodings (pipeline/encoding_spec.py; float32 by default, as the paper sends them): `encode_up` encodes each
client's prototypes, `encode_down` the global ones, a row per class; class ids, counts and accuracies travel as
they are. float16, int8 (per prototype: a byte a value, its minimum and step), topk:K (its K largest-magnitude
values, the others decode to 0) and delta:T[+E] (only the prototypes that moved by more than T since what the
receiver holds: each sender keeps the receiver's copy, as decoded, in the checkpoint) are allowed; argmax is refused
when params load (a feature row has no class to point to). The receiver decodes before use: the server aggregates
the prototypes it decoded, a client pulls toward the global prototypes it decoded. The prototype reading of the
evaluation compares with the server's global prototypes as they are (a measurement, not traffic).

Bytes per selected client and round (c classes held, c' global classes, D prototype dims, r(D) the bytes of one
encoded row, pipeline/federation/encoding.py's row_bytes: 4D in float32): down = c'*(8 + r(D)) (from round 2, or
once anything was uploaded); up = c*(8 + 8 + r(D)) [+ 4c with confidence]. A delta adds a bitmap of the rows (one
bit each, whole bytes) and sends r(D) only for the rows that moved.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.encoding_spec import check_columns
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.contract import Evaluation, LocalUpdate, Server, ServerContext, Upload, Wire
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload
from pipeline.errors import ConfigError
from pipeline.federation.losses import ce_rows
from pipeline.seeds import torch_generator

ADAPTER_HIDDEN = 128
FEATURE_DIM = "feature_dim"  # the set-up payload announcing a client's feature size
PROTOTYPES = "prototypes"  # the payload kind, and the name of its encoded array
FILL = "zero"  # what top-k's dropped values decode to: a prototype's values are features, kept by magnitude


# -- pure functions (unit-tested) -------------------------------------------------------


def class_prototypes(features: torch.Tensor, labels: torch.Tensor, num_classes: int, how: str = "mean"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """features [n, D], labels [n] -> (prototypes [C, D] (zero rows for absent classes), counts [C] int64).
    `mean`: per-class mean (index_add); `median`: per-class torch.median (lower median for even counts)."""
    D = features.shape[1]
    counts = torch.zeros(num_classes, dtype=torch.long, device=features.device)
    counts.index_add_(0, labels, torch.ones_like(labels))
    protos = torch.zeros(num_classes, D, dtype=features.dtype, device=features.device)
    if how == "mean":
        protos.index_add_(0, labels, features)
        held = counts > 0
        protos[held] /= counts[held].unsqueeze(1).to(features.dtype)
    elif how == "median":
        for c in torch.nonzero(counts).flatten().tolist():  # one median per class, no per-sample loop
            protos[c] = torch.median(features[labels == c], dim=0).values
    else:
        raise ValueError(f"unknown prototype kind {how!r}")
    return protos, counts


def aggregation_weights(counts: torch.Tensor, held: torch.Tensor, how: str, accuracy: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """counts [K, C], held [K, C] bool, accuracy [K, C] -> weights [K, C] that sum to 1 over the
    clients holding each class (all zero for a class nobody holds)."""
    if how == "count":
        w = counts.double() * held
    elif how == "uniform":
        w = held.double()
    elif how == "confidence":
        if accuracy is None:
            raise ValueError("confidence aggregation needs per-class accuracies")
        logits = accuracy.double().masked_fill(~held, float("-inf"))
        return torch.softmax(logits, dim=0).nan_to_num(0.0)  # a column of -inf (nobody holds it) -> NaN -> 0
    else:
        raise ValueError(f"unknown aggregation {how!r}")
    total = w.sum(dim=0, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(1e-300), torch.zeros_like(w))


def aggregate(protos: torch.Tensor, counts: torch.Tensor, held: torch.Tensor, how: str = "count",
              accuracy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Latest uploads protos [K, C, D] -> (global prototypes [C, D] float32, has [C] bool)."""
    w = aggregation_weights(counts, held, how, accuracy)
    global_ = (w.unsqueeze(-1) * protos.double()).sum(dim=0).float()
    return global_, held.any(dim=0)


def prototype_mse_rows(z: torch.Tensor, prototypes: torch.Tensor, has: torch.Tensor) -> torch.Tensor:
    """Per row: the mean over the D dims of (z - the global prototype of its label)^2, times has
    (1.0 where the label has a global prototype, else 0: the reference code substitutes the
    sample's own feature there, i.e. zero error). Summed and divided by the batch size this is
    the MSE over all B*D entries."""
    return (z - prototypes).pow(2).mean(dim=1) * has


def feature_dim(model: nn.Module) -> int:
    dim = getattr(model, "feature_dim", None)
    if dim is None:
        dim = model.head.in_features
    return int(dim)


def make_adapter(in_dim: int, out_dim: int, seed: int) -> nn.Sequential:
    """Linear(in_dim, 128)-ReLU-Linear(128, out_dim), seeded: the first layer by (seed, in_dim), the second
    by seed alone, so every client's adapter starts from the same map where shapes allow."""
    first, second = nn.Linear(in_dim, ADAPTER_HIDDEN), nn.Linear(ADAPTER_HIDDEN, out_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch_generator(seed, "init-align", in_dim).initial_seed()))
        first.reset_parameters()
        torch.manual_seed(int(torch_generator(seed, "init-align").initial_seed()))
        second.reset_parameters()
    return nn.Sequential(first, nn.ReLU(), second)


@torch.inference_mode()
def embed_all(model: nn.Module, x: torch.Tensor, batch_size: int, num_classes: int, dim: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval-mode (prototype-space features [n, D], logits [n, C]) over x, in batches."""
    model.eval()
    adapter = getattr(model, "adapter", None)
    zs, logits = [], []
    for start in range(0, len(x), batch_size):
        f = model.features(x[start : start + batch_size])
        zs.append(f if adapter is None else adapter(f))
        logits.append(model.head(f))
    if not zs:
        return x.new_zeros(0, dim), x.new_zeros(0, num_classes)
    return torch.cat(zs), torch.cat(logits)


# -- the method --------------------------------------------------------------------------


class FedProtoClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.fedproto
        self.up, self.down = parse_encoding(self.p.encode_up), parse_encoding(self.p.encode_down)

    def setup(self, client):
        """Announce the client's feature size (the prototype size without `align`): one int32, set-up traffic."""
        if self.p.align:  # the prototypes have align_dim entries, known from params
            return Upload()
        return Upload([Payload(FEATURE_DIM, {FEATURE_DIM: torch.tensor([feature_dim(client.model)], dtype=torch.int32)})])

    def _copy(self, client, key: str, dim: int) -> torch.Tensor:
        """A delta encoding's copy of what the other side holds, [C, dim] (NaN rows: nothing yet), kept in the
        client's state (so in the checkpoint)."""
        return client.state.setdefault(key, torch.full((self.num_classes, dim), float("nan")))

    def prepare(self, client):
        """With `align`, the client's adapter joins its model (trained by its optimizer, never sent)."""
        if self.p.align:
            client.model.adapter = make_adapter(feature_dim(client.model), self.p.align_dim, self.params.seed).to(
                client.x_train.device)
            client.new_optimizer()

    def begin(self, client, download, round_):
        dim = prototype_dim(self.p, client.model)
        table = torch.zeros(self.num_classes, dim, dtype=torch.float32)  # prototypes travel as float32
        has = torch.zeros(self.num_classes)
        for p in download:  # nothing arrives before the first upload
            ids = p.arrays["class_ids"]
            copy = self._copy(client, "global_copy", dim) if self.down.kind == "delta" else None  # as decoded last
            table[ids] = decode(self.down, PROTOTYPES, p.arrays, held=None if copy is None else copy[ids], columns=dim,
                                fill=FILL)
            if copy is not None:
                copy[ids] = table[ids]
            has[ids] = 1.0
        y = client.y_train
        return {"prototype": table.to(y.device)[y], "has": has.to(y.device)[y]}

    def loss(self, model, step, phase):
        f = model.features(step.x)
        rows = ce_rows(model.head(f), step.y)
        if self.p.lambda_ > 0:
            z = model.adapter(f) if self.p.align else f
            rows = rows + self.p.lambda_ * prototype_mse_rows(z, step.t["prototype"], step.t["has"])
        return rows

    def end(self, client, targets, records, round_):
        """An eval-mode pass over the training data: per-class prototypes (encoded), counts
        and, for confidence aggregation, the classifier's per-class accuracy."""
        C, p = self.num_classes, self.p
        dim = prototype_dim(p, client.model)
        z, logits = embed_all(client.model, client.x_train, self.params.train.eval_batch_size, C, dim)
        y = client.y_train
        protos, counts = class_prototypes(z, y, C, p.prototype)
        mine = torch.nonzero(counts > 0).flatten()
        arrays: dict[str, torch.Tensor] = {"class_ids": mine.cpu(), "counts": counts[mine].cpu()}
        if p.aggregation == "confidence":
            correct = torch.zeros(C, device=z.device).index_add_(0, y, (logits.argmax(1) == y).float())
            arrays["accuracies"] = (correct[mine] / counts[mine].float()).cpu()
        mine_cpu = mine.cpu()
        copy = self._copy(client, "sent_copy", dim) if self.up.kind == "delta" else None  # as the server decoded them
        enc = encode(self.up, PROTOTYPES, protos[mine].float().cpu(), held=None if copy is None else copy[mine_cpu],
                     fill=FILL)
        if copy is not None:
            copy[mine_cpu] = enc.decoded
        arrays.update(enc.parts)
        return Upload([Payload(PROTOTYPES, arrays)])

    def evaluate(self, client, download):
        """Two readings: the local classifier ("classifier"), and the nearest global prototype
        ("prototype"; the evaluation download, none before the first upload)."""
        dim = prototype_dim(self.p, client.model)
        z, logits = embed_all(client.model, client.x_test, self.params.train.eval_batch_size, self.num_classes, dim)
        n = len(client.y_test)
        acc_cls = float((logits.argmax(1) == client.y_test).sum()) / n if n else float("nan")
        if download and n:
            (prototypes,) = download
            classes = prototypes.arrays["class_ids"].to(z.device)
            protos = prototypes.arrays["prototypes"].to(z.device)
            pred = classes[torch.cdist(z, protos.to(z.dtype)).argmin(dim=1)]
            acc_proto = float((pred == client.y_test).sum()) / n
        else:
            # no global prototypes yet (round 0 / before any upload): nothing to compare
            # against, so the prototype reading falls back to the local classifier
            acc_proto = acc_cls
        return Evaluation(n, {"classifier": acc_cls, "prototype": acc_proto})


def prototype_dim(p, model: nn.Module) -> int:
    return p.align_dim if p.align else feature_dim(model)


class FedProto(Server):
    name = "fedproto"
    client_cls = FedProtoClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx)
        self.p = ctx.params.fedproto
        self.up, self.down = parse_encoding(self.p.encode_up), parse_encoding(self.p.encode_down)
        self.sent: dict[int, torch.Tensor] = {}  # delta down: the global prototypes each client decoded last [C, D]
        # a top-k must drop some of a prototype's values: with align its size is known from params (checked when they
        # load), else it is the clients' feature size, known here from their architecture, before any training
        for key, spec in (("encode_up", self.up), ("encode_down", self.down)):
            why = None if self.p.align or spec.kind != "topk" else check_columns(spec, feature_dim(ctx.initial_model(0)))
            if why:
                raise ConfigError(f"fedproto.{key} = {str(spec)!r}: {why} (the prototypes have the clients' feature "
                                  "size)")
        if self.p.align:
            self._allocate(self.p.align_dim)
        # otherwise the prototype size is the clients' feature size, which their set-up uploads announce

    def _allocate(self, D: int) -> None:
        """The server's tables: the latest upload of every client (as decoded)."""
        K, C = self.ctx.num_clients, self.ctx.num_classes
        self.dim = D
        self.protos = torch.zeros(K, C, D)
        self.counts = torch.zeros(K, C, dtype=torch.long)
        self.accuracy = torch.zeros(K, C)
        self.held = torch.zeros(K, C, dtype=torch.bool)
        self.global_protos = torch.zeros(C, D)
        self.global_has = torch.zeros(C, dtype=torch.bool)

    def wire(self, k):
        """Up, per class k holds: id, count (int64), [accuracy (float32)], the prototype encoded; down, per global
        class: id, the prototype encoded. A delta's bytes depend on what moved: the ids (and counts, accuracies),
        a bitmap of the rows and at most every row, in whole bytes."""
        p, C = self.p, self.ctx.num_classes
        D = p.align_dim if p.align else feature_dim(self.ctx.initial_model(k))
        held = len(self.ctx.client_labels(k).unique())

        def rows(spec, fixed: int, n: int, exact: bool) -> Wire:
            one = row_bytes(spec, D, fill=FILL)
            if one is not None:
                return Wire(fixed + one, n, exact)
            return Wire(1, n * (fixed + row_bytes(spec.inner, D)) + -(-n // 8), exact=False)

        up = rows(self.up, 8 + 8 + (4 if p.aggregation == "confidence" else 0), held, True)
        return {("up", PROTOTYPES): up, ("down", PROTOTYPES): rows(self.down, 8, C, False),
                ("up", FEATURE_DIM): Wire(4)}

    def setup(self, uploads):
        if self.p.align:
            return
        dims = sorted({int(up.payload(FEATURE_DIM).arrays[FEATURE_DIM][0]) for up in uploads.values()})
        if len(dims) != 1:
            raise ConfigError(f"fedproto: the clients' feature sizes differ ({dims}); prototypes "
                              "cannot be shared: set fedproto.align: true")
        self._allocate(dims[0])

    # -- one round ---------------------------------------------------------------------

    def configure(self, round_, selected):
        classes = torch.nonzero(self.global_has).flatten()
        if not len(classes):  # nothing to send before the first upload
            return {k: [] for k in selected}
        rows = self.global_protos[classes]  # a copy (indexed): the clients never share the server's table
        if self.down.kind != "delta":  # the same encoded rows for every client
            parts = encode(self.down, PROTOTYPES, rows, fill=FILL).parts
            return {k: [Payload(PROTOTYPES, {"class_ids": classes, **parts})] for k in selected}
        downloads = {}
        for k in selected:  # only what moved since what k decoded last
            sent = self.sent.setdefault(k, torch.full((self.ctx.num_classes, self.dim), float("nan")))
            enc = encode(self.down, PROTOTYPES, rows, held=sent[classes], fill=FILL)
            sent[classes] = enc.decoded
            downloads[k] = [Payload(PROTOTYPES, {"class_ids": classes, **enc.parts})]
        return downloads

    def aggregate(self, round_, uploads):
        for k, up in uploads.items():
            self._receive(k, up.payloads[0].arrays)
        self.count_work(2.0 * self.protos.numel())  # the weighted sum over clients of [K, C, D] prototypes
        self.global_protos, self.global_has = aggregate(self.protos, self.counts, self.held, self.p.aggregation,
                                                        self.accuracy)

    def _receive(self, k: int, arrays: dict[str, torch.Tensor]) -> None:
        """Server side: replace client k's latest upload with what arrived."""
        ids = arrays["class_ids"]
        held = self.protos[k, ids] if self.up.kind == "delta" else None  # a delta's unsent rows stay as they were
        new = decode(self.up, PROTOTYPES, arrays, held=held, columns=self.dim, fill=FILL)
        self.held[k].zero_()
        self.counts[k].zero_()
        self.accuracy[k].zero_()
        self.protos[k, ids] = new.to(self.protos.dtype)
        self.held[k, ids] = True
        self.counts[k, ids] = arrays["counts"]
        if "accuracies" in arrays:
            self.accuracy[k, ids] = arrays["accuracies"].to(self.accuracy.dtype)

    # -- evaluation ------------------------------------------------------------------

    def evaluation(self, round_):
        classes = torch.nonzero(self.global_has).flatten()
        if not len(classes):
            return []
        return [Payload("prototypes", {"class_ids": classes, "prototypes": self.global_protos[classes]})]

    def report(self, round_, evaluations):
        by = {name: [(k, e.acc[name], e.n) for k, e in sorted(evaluations.items())]
              for name in ("classifier", "prototype")}
        mean = lambda rows: sum(a for _, a, _ in rows) / len(rows)  # noqa: E731
        extras = {"acc_classifier": mean(by["classifier"]), "acc_prototype": mean(by["prototype"])}
        return by[self.p.eval], extras

    # -- checkpoint ------------------------------------------------------------------

    STATE = ("protos", "counts", "accuracy", "held", "global_protos", "global_has")

    def state_dict(self) -> dict:
        return {**{name: getattr(self, name).clone() for name in self.STATE},
                "sent": {k: t.clone() for k, t in self.sent.items()}}

    def load_state_dict(self, state: dict) -> None:
        if not self.p.align:
            self._allocate(state["protos"].shape[-1])
        for name in self.STATE:
            getattr(self, name).copy_(state[name])
        self.sent = {int(k): t.clone() for k, t in state.get("sent", {}).items()}
