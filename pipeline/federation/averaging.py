"""Parameter averaging, shared by the methods that average models (FedAvg, MTFL, pFedMe, FedAlt):
the sample-weighted mean of state dicts, and the server half that keeps one global state.

Under `train.schedule: async` (pipeline/train/schedules/async_.py) that server half is FedAsync (Xie et al., 2019):
each upload is mixed into the global state as it arrives,

    global <- (1 - w) * global + w * upload,   w = alpha * s(staleness),   s(t) = (1 + t) ** -a

(FedAsync's polynomial staleness function; alpha = `train.async_alpha`, a = `train.async_staleness_exponent`),
the staleness being how many times the global state changed between the client's download and its upload's
arrival. With `train.async_buffer` B > 1 (FedBuff-style buffering) the server holds arrivals until it has B
and folds them at once: global <- (1 - sum w_i) * global + sum w_i * upload_i, w_i = alpha * s(t_i) / B
(each upload's staleness counted when it arrives; B = 1 is FedAsync). Unlike FedBuff, the buffer mixes
models, not model differences, and there is no server learning rate: B = 1 is FedAsync exactly.
Uploads are not weighted by their sample counts (FedAsync does not).
"""

from __future__ import annotations

import torch

from pipeline.encoding_spec import Spec
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.contract import SAMPLE_COUNT, Server, ServerContext, Wire, state_bytes, weight_of
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Per-tensor weighted mean; integer buffers (BatchNorm's step counter) are rounded back."""
    total = float(sum(weights))
    out = {}
    for name, first in states[0].items():
        acc = sum(s[name].double() * (w / total) for s, w in zip(states, weights))
        out[name] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


def staleness_weight(staleness: int, alpha: float, exponent: float) -> float:
    """FedAsync's mixing weight of an upload that is `staleness` global versions old: alpha * (1 + staleness)^-a."""
    return alpha * (1.0 + staleness) ** (-exponent)


def mix(global_state: dict[str, torch.Tensor], states: list[dict[str, torch.Tensor]], weights: list[float]
        ) -> dict[str, torch.Tensor]:
    """(1 - sum w) * global + sum w_i * state_i, per tensor in float64; integer buffers (BatchNorm's step counter)
    are rounded back."""
    keep = 1.0 - float(sum(weights))
    out = {}
    for name, g in global_state.items():
        acc = g.double() * keep + sum(s[name].double() * w for s, w in zip(states, weights))
        out[name] = acc.round().to(g.dtype) if not g.is_floating_point() else acc.to(g.dtype)
    return out


def state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in model.state_dict().items()}


# -- encoded states (`<method>.encode_down`: the global state; `<method>.encode_up`: the client's change to it) --

def _row_shape(spec: Spec, t: torch.Tensor) -> tuple[int, int]:
    """The rows a tensor is encoded as: its first dimension (a layer's output channels) by the rest; a vector (a
    bias, BatchNorm's weights and statistics) or a scalar is one row, so int8 pays one minimum and step for it, not
    one per entry (9 bytes an entry, more than float32's 4); for top-k the whole tensor is one row, so it keeps the
    tensor's largest entries wherever they are."""
    if spec.kind == "topk" or t.dim() <= 1:
        return 1, t.numel()
    return t.shape[0], t.numel() // t.shape[0]


def encode_state(spec: Spec, state: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None = None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(parts that travel, the state the receiver decodes): every floating tensor's rows (of state - base with a
    base) encoded; integer buffers (BatchNorm's step counter) travel as they are."""
    parts, decoded = {}, {}
    for name, t in state.items():
        t = t.detach().cpu()
        if not t.is_floating_point():
            parts[name], decoded[name] = t.clone(), t.clone()
            continue
        change = t if base is None else t - base[name]
        enc = encode(spec, name, change.reshape(_row_shape(spec, t)), fill="zero")
        parts.update(enc.parts)
        decoded[name] = (enc.decoded.reshape(t.shape) if base is None else base[name] + enc.decoded.reshape(t.shape))
    return parts, decoded


def decode_state(spec: Spec, parts: dict[str, torch.Tensor], template: dict[str, torch.Tensor],
                 base: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The receiver's side of encode_state: `template` gives the names, shapes and types (the receiver's own)."""
    out = {}
    for name, t in template.items():
        if not t.is_floating_point():
            out[name] = parts[name]
            continue
        columns = _row_shape(spec, t)[1]
        values = decode(spec, name, parts, columns=columns, fill="zero").to(t.dtype).reshape(t.shape)
        out[name] = values if base is None else base[name] + values
    return out


def state_size(spec: Spec, state: dict[str, torch.Tensor]) -> int:
    """What encode_state makes of a state of these shapes weighs, from the shapes alone (row_bytes: a float32,
    float16 or int8 row of d values weighs 4d, 2d or d + 8 bytes; a tensor of n entries at topk:F, one row,
    round(F * n) values of 4 bytes and their positions, 1, 2 or 4 bytes each by n); integer buffers as they are."""
    if spec.lossless:
        return state_bytes(state)
    total = 0
    for t in state.values():
        if not t.is_floating_point():
            total += t.numel() * t.element_size()
            continue
        rows, columns = _row_shape(spec, t)
        total += rows * row_bytes(spec, columns, fill="zero")
    return total


def receive_state(client, payload: Payload, codes: tuple[Spec, Spec], template: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """The global state a client makes of its download, `codes` = (its encoding down, up); `template`: the tensors
    the method shares, as the client's model holds them. An encoded upload is its change to this state: kept."""
    down, up = codes
    state = payload.arrays if down.lossless else decode_state(down, payload.arrays, template)
    if not up.lossless:
        client.state["received"] = {n: t.detach().cpu().clone() for n, t in state.items()}
    return state


def encode_change(client, spec: Spec, state: dict[str, torch.Tensor], base: dict[str, torch.Tensor],
                  feedback: bool | None = None) -> dict[str, torch.Tensor]:
    """The parts of a client's change from `base` (what it started from) to `state`, encoded; integer buffers travel
    as they are. With `feedback` (top-k's default) error feedback (Stich et al. 2018, Karimireddy et al. 2019): the
    client adds to its change what its earlier encodings left out (client.state["residual"], per tensor,
    checkpointed with the client) and keeps what this one leaves out, so every entry's change is sent in the end."""
    feedback = spec.kind == "topk" if feedback is None else feedback
    residual = client.state.get("residual", {}) if feedback else {}
    change = {}
    for name, t in state.items():
        t = t.detach().cpu()
        if t.is_floating_point():
            t = t - base[name] + residual[name] if name in residual else t - base[name]
        change[name] = t
    parts, sent = encode_state(spec, change)
    if feedback:  # a method may encode its state in pieces (FedAlt's blocks): each keeps its own tensors' residuals
        client.state["residual"] = {**residual, **{n: t - sent[n] for n, t in change.items() if t.is_floating_point()}}
    return parts


def state_payload(client, state: dict[str, torch.Tensor], up: Spec) -> Payload:
    """A client's upload of its state: as it is in float32, else its change to the global it received, encoded."""
    if up.lossless:
        return Payload("params", state)
    return Payload("params", encode_change(client, up, state, client.state["received"]))


def state_codes(params, method: str) -> tuple[Spec, Spec]:
    """A parameter-averaging method's (encode_down, encode_up) from its params section (float32 when it has none)."""
    section = getattr(params, method, None)
    return (parse_encoding(getattr(section, "encode_down", "float32")),
            parse_encoding(getattr(section, "encode_up", "float32")))


def floor_variances(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BatchNorm's running variances at 0 where noise on the upload (train.dp_noise) made them negative, which would
    make every model that loads them compute NaN. The server does this to what it received: post-processing, which
    costs no privacy."""
    return {n: t.clamp(min=0) if n.endswith("running_var") else t for n, t in state.items()}


class ParameterAveraging(Server):
    """The server half of the parameter-averaging methods (FedAvg, MTFL, pFedMe): one global state
    sent to every selected client, replaced by the sample-weighted mean of what they upload."""


    def __init__(self, ctx: ServerContext, global_state: dict[str, torch.Tensor]):
        super().__init__(ctx)
        self.global_state = global_state
        t = ctx.params.train
        self.asynchronous = t.schedule == "async"  # FedAsync: uploads folded in as they arrive (`arrive`)
        self.version = 0  # async: how many times the global state has changed
        self.sent_version: dict[int, int] = {}  # async: the version each client downloaded last
        self.buffer: list[tuple[dict[str, torch.Tensor], float]] = []  # async: arrivals not folded yet, with weights
        self.down, self.up = state_codes(ctx.params, self.name)
        self.sent: dict[int, dict[str, torch.Tensor]] = {}  # encoded uploads: the global each client decoded last
        self.noised = t.dp_noise > 0  # train.dp_noise: the uploads carry noise (pipeline/federation/dp_noise.py)

    def wire(self, k):
        """The global state down, the client's state of the same tensors up with its sample count (int32); encoded,
        what the encoding makes of a state of these shapes (`state_size`)."""
        return {("down", "params"): Wire(state_size(self.down, self.global_state)),
                ("up", "params"): Wire(state_size(self.up, self.global_state)), ("up", SAMPLE_COUNT): Wire(4)}

    def configure(self, round_, selected):
        if self.asynchronous:  # what an arriving upload's staleness is counted from
            self.sent_version.update({k: self.version for k in selected})
        if self.down.lossless and self.up.lossless:
            return {k: [Payload("params", dict(self.global_state))] for k in selected}
        parts, decoded = ((dict(self.global_state), self.global_state) if self.down.lossless
                          else encode_state(self.down, self.global_state))
        if not self.up.lossless:  # an encoded upload is the client's change to what it decoded
            self.sent.update({k: decoded for k in selected})
        return {k: [Payload("params", parts)] for k in selected}

    def uploaded_state(self, k: int, upload) -> dict[str, torch.Tensor]:
        """Client k's state from its upload: as it is, or the global it decoded plus its decoded change; with noise on
        the uploads, its BatchNorm variances floored at 0 (`floor_variances`)."""
        arrays = upload.payload("params").arrays
        state = arrays if self.up.lossless else decode_state(self.up, arrays, self.sent[k], base=self.sent[k])
        return floor_variances(state) if self.noised else state

    def mean_upload(self, uploads) -> dict[str, torch.Tensor]:
        states = [self.uploaded_state(k, u) for k, u in uploads.items()]
        self.count_work(2.0 * sum(t.numel() for state in states for t in state.values()))  # a mul, an add each
        return weighted_average(states, [weight_of(u) for u in uploads.values()])

    def aggregate(self, round_, uploads):
        self.global_state = self.mean_upload(uploads)

    def arrive(self, round_, k, upload):
        """FedAsync: mix one arriving upload in, staleness-weighted; with a buffer, every B arrivals at once."""
        t = self.ctx.params.train
        staleness = self.version - self.sent_version.pop(k)
        self.buffer.append((self.uploaded_state(k, upload), staleness_weight(staleness, t.async_alpha,
                                                                        t.async_staleness_exponent)))
        if len(self.buffer) >= t.async_buffer:
            states, weights = zip(*self.buffer)
            self.global_state = mix(self.global_state, list(states), [w / t.async_buffer for w in weights])
            self.version += 1
            self.buffer = []

    def state_dict(self) -> dict:
        state = {"global": {n: t.clone() for n, t in self.global_state.items()}, "sent": dict(self.sent)}
        if self.asynchronous:
            state["async"] = {"version": self.version, "sent_version": dict(self.sent_version),
                              "buffer": [(dict(s), w) for s, w in self.buffer]}
        return state

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}
        self.sent = dict(state.get("sent", {}))
        if self.asynchronous:
            a = state["async"]
            self.version, self.sent_version = int(a["version"]), {int(k): int(v) for k, v in a["sent_version"].items()}
            self.buffer = [(dict(s), float(w)) for s, w in a["buffer"]]
