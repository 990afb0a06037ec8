"""Label-distribution inference: what an honest-but-curious server can estimate about each client's class mix
from the uploads it received, scored by total-variation distance to the client's true training mix.

Source of the attack on parameter-averaging methods: A. Wainakh, F. Ventola, T. Müßig, J. Keim, C. Garcia Cordero,
E. Zimmer, T. Grube, K. Kersting and M. Mühlhäuser, "User-Level Label Leakage from Gradients in Federated
Learning", Proceedings on Privacy Enhancing Technologies (PETS) 2022 (LLG). Its observation: the cross-entropy
gradient of the last layer's bias for class c is the batch mean of (p_c - y_c), negative only when the batch
holds class c, and its size grows with how many samples of c it holds; the weight rows behave alike (their sum,
with non-negative ReLU features). A model update is minus the learning rate times those gradients, summed over the
local steps, so the classifier's bias *rises* for the classes a client trains on.

The attacker: an honest-but-curious server. It runs the protocol as written and keeps what each client sent it
(any rounds, the set-up included), knows the method and its params (the encodings, so it can decode as the
protocol does) and the model state it sent each client (the base a model upload is compared with). It never
sees a client's data, model or optimizer.

What each method's client sends up, and what that reveals about its class mix (pipeline/methods/<name>/method.py):
  fedcache  set-up "hashes": sample ids, every sample's LABEL and its hash code; rounds "logits": sample ids and
            per-sample logits -> the exact mix, sent by design (the protocol needs the labels: nothing to attack);
            without the set-up upload, the argmax of the round logits counts the classes: only as good as the
            models (tiny setting after 2 rounds: TV 0.44-0.63, worse than the uniform guess's 0.27-0.32).
  fd        "class_logits": the ids of the classes it holds and their mean logits (no counts) -> which classes are
            present, not how many of each: the estimate is uniform over the held classes.
  feddkc    "features": per-sample stem features, logits and LABELS (FedGKT-style) -> the exact mix, sent by design.
  fedict    "features": as FedDKC (per-sample features, logits, labels) -> the exact mix, sent by design.
  fedproto  set-up "feature_dim" (nothing about labels); rounds "prototypes": held class ids, per-class sample
            COUNTS, prototypes (and accuracies) -> the exact mix from the counts, sent by design.
  fedavg    "params": its whole model state after local training (or its encoded change) and "num_samples" -> the
            classifier layer's update against the global model the server sent (LLG, below).
  mtfl      "params": the shared tensors (BatchNorm stays private; the classifier head is shared) and
            "num_samples" -> the head's update, as FedAvg.
  pfedme    "params": its local copy w of the global model, pulled toward its personal model, and "num_samples"
            -> the head's update, as FedAvg (weaker: w moves eta * lambda of the way a batch).
  fedalt    "block1".."block3": its whole multi-exit model, every exit's classifier included, and "num_samples"
            -> the update of every exit's classifier, averaged.
  local     nothing -> nothing to estimate (mix None).
  pdfl      nothing to any server (there is none: clients relay to their neighbours) -> mix None for a server;
            a curious NEIGHBOUR receives "knowledge" (per-class soft predictions P and class COUNTS n: the exact
            mix) and "model" (the whole state); given those payloads, the estimate is that exact mix.

The parameter-averaging estimator (LLG's, with a known step size): s_c = the change of class c's bias, averaged over
the model's classifier layers (every Linear whose weight is [C, D] with a [C] bias; the weight row's sum where a
layer has no bias). Over a local update, s_c ~= lambda * (pi_c - qbar_c): pi_c the client's share of class c,
qbar_c the model's mean predicted probability of c on the client's samples while it trained, and lambda how far a
unit of mean bias gradient moves the bias over the update (the "impact"), which the server knows from the
protocol: the learning rate, momentum and batch size in the run's params and the sample count the upload carries
(`update_scale`). Assuming the model predicts every class alike (qbar_c = 1/C), the estimate is
max(1/C + s / lambda, 0) normalised. Without the params (context gives neither "params" nor "scale") it falls back to
max(s, 0) normalised: the classes whose bias rose, weighted by how much (uncalibrated; says so in its note).
Its assumptions, and where they fail: the uniform prediction prior (an untrained or balanced global model; a model
that already fits the client's classes, late in training, gives small noisy changes); a constant mean gradient over
the local steps for lambda (the gradient shrinks as the model learns, so lambda is overestimated and the estimate
drawn toward uniform); for pFedMe, lambda is that of its w (eta * lambda of the way to theta a batch), simulated;
for FedAlt, momentum carried over from earlier rounds is ignored. Tiny setting, round 1: the calibrated estimate
beats the uniform guess on 2-class, Dirichlet 0.1 and Dirichlet 1.0 clients; the uncalibrated one only on the first
two (it over-concentrates on near-IID clients). `over_clients` reports the uniform guess beside every estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from pipeline.encoding_spec import FLOAT32, Spec
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.averaging import decode_state
from pipeline.federation.contract import SAMPLE_COUNT
from pipeline.federation.encoding import decode
from pipeline.federation.ledger import Payload
from pipeline.results.intervals import mean_interval

SENT = "sent by design"
PER_CLASS = "from per-class statistics"
CLASSIFIER = "from the classifier update"
PER_SAMPLE = "from per-sample logits"  # FedCache's round logits, when the set-up upload was not recorded
NOTHING = "nothing uploaded"

AVERAGING = ("fedavg", "mtfl", "pfedme", "fedalt")
GKT = ("feddkc", "fedict")


@dataclass(frozen=True)
class Estimate:
    """What the server estimates of one client's class mix: `mix` [C] (sums to 1), or None when it received
    nothing that bears on it; `how` says where the estimate comes from; `note` anything a reader should know."""

    mix: np.ndarray | None
    how: str
    note: str = ""


# -- small helpers ------------------------------------------------------------------------------------------------


def mix_of_labels(labels, num_classes: int) -> np.ndarray:
    """The class mix [C] of a list of labels (a client's true training mix, or the labels it uploaded)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64).ravel(), minlength=num_classes)[:num_classes]
    return _normalised(counts.astype(np.float64))


def _normalised(weights: np.ndarray) -> np.ndarray:
    """weights [C] >= 0 -> a distribution; uniform when they are all zero (no information)."""
    total = float(weights.sum())
    if total <= 0:
        return np.full(len(weights), 1.0 / len(weights))
    return weights / total


def _numpy(array) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)


def _latest(uploads: list[Payload], kind: str) -> Payload | None:
    """The last recorded payload of a kind (uploads are in the order the server received them)."""
    found = [p for p in uploads if p.kind == kind]
    return found[-1] if found else None


def _spec(context: dict, key: str = "encode_up") -> Spec:
    """The encoding the client's uploads travel in (the method's params say it; float32 when not given)."""
    value = context.get(key, FLOAT32)
    return parse_encoding(value) if isinstance(value, str) else value


# -- per family ---------------------------------------------------------------------------------------------------


def _fedcache(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    setup = _latest(uploads, "hashes")
    if setup is not None:  # every sample's label travels with its hash code
        return Estimate(mix_of_labels(setup.arrays["labels"], num_classes), SENT,
                        "the set-up upload carries every training sample's label")
    rounds = [p for p in uploads if p.kind == "logits"]
    if not rounds:
        return Estimate(None, NOTHING)
    # without the labels: each sample's latest logits, their argmax counted (a sample is counted once)
    spec = _spec(context)
    if spec.kind == "delta":
        return Estimate(None, PER_SAMPLE, "delta-encoded logits need the cache's copy to decode: not attempted")
    predicted: dict[int, int] = {}
    for p in rounds:
        logits = decode(spec, "logits", p.arrays, columns=num_classes)
        for sample, label in zip(_numpy(p.arrays["sample_ids"]).tolist(), _numpy(logits.argmax(dim=1)).tolist()):
            predicted[sample] = label
    return Estimate(mix_of_labels(list(predicted.values()), num_classes), PER_SAMPLE,
                    "argmax of each sample's latest uploaded logits (the set-up upload, with the labels, not recorded): "
                    "only as good as the client's model")


def _gkt(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    last = _latest(uploads, "features")
    if last is None:
        return Estimate(None, NOTHING)
    return Estimate(mix_of_labels(last.arrays["labels"], num_classes), SENT,
                    "every training sample's label travels with its features")


def _fd(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    last = _latest(uploads, "class_logits")
    if last is None:
        return Estimate(None, NOTHING)
    held = np.zeros(num_classes)
    held[_numpy(last.arrays["class_ids"]).astype(np.int64)] = 1.0
    return Estimate(_normalised(held), PER_CLASS, "the held classes are sent, their counts are not: uniform over them")


def _fedproto(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    last = _latest(uploads, "prototypes")
    if last is None:
        return Estimate(None, NOTHING)
    ids = _numpy(last.arrays["class_ids"]).astype(np.int64)
    weights = np.zeros(num_classes)
    if "counts" in last.arrays:  # FedProto's count-weighted aggregation needs them: sent with the prototypes
        weights[ids] = _numpy(last.arrays["counts"]).astype(np.float64)
        return Estimate(_normalised(weights), SENT, "per-class sample counts travel with the prototypes")
    weights[ids] = 1.0
    return Estimate(_normalised(weights), PER_CLASS, "held classes only (no counts sent): uniform over them")


def _pdfl(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    knowledge = _latest(uploads, "knowledge")
    if knowledge is None:
        return Estimate(None, NOTHING, "pDFL has no server: clients relay their model and knowledge to neighbours")
    return Estimate(_normalised(_numpy(knowledge.arrays["counts"]).astype(np.float64)), SENT,
                    "a neighbour's view (pDFL has no server): the knowledge payload carries the class counts")


def classifier_layers(state: dict[str, torch.Tensor], num_classes: int) -> list[tuple[str, str | None]]:
    """(weight name, bias name or None) of every Linear classifier in a state: a [C, D] weight, with its [C] bias."""
    layers = []
    for name, t in state.items():
        if name.endswith(".weight") and t.dim() == 2 and t.shape[0] == num_classes:
            bias = name.removesuffix(".weight") + ".bias"
            has_bias = bias in state and state[bias].shape == (num_classes,)
            layers.append((name, bias if has_bias else None))
    return layers


def _changes(arrays: dict[str, torch.Tensor], base: dict[str, torch.Tensor], names: list[str], spec: Spec
             ) -> dict[str, torch.Tensor]:
    """The client's change to these tensors: in float32 it uploads its trained state (less the base); with a lossy
    encoding its change itself, encoded (pipeline/federation/averaging.py), decoded here as the server does."""
    if not spec.lossless:
        change = decode_state(spec, arrays, {n: base[n] for n in names})  # no base given: the change itself
        return {n: t.double() for n, t in change.items()}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise ValueError(f"the upload lacks {missing[:3]}: an encoded upload? pass the method's encode_up in context")
    return {n: torch.as_tensor(arrays[n]).double() - base[n].double() for n in names}


def classifier_scores(arrays: dict[str, torch.Tensor], base: dict[str, torch.Tensor], num_classes: int,
                      spec: Spec = FLOAT32) -> np.ndarray:
    """s [C]: the rise of each class's classifier bias, averaged over the classifier layers (a weight row's sum where
    a layer has no bias), i.e. minus the summed bias gradient times the step size (LLG's signal)."""
    layers = [(w, b) for w, b in classifier_layers(base, num_classes) if (b or w) in arrays
              or any(k.startswith((b or w) + ".") for k in arrays)]
    if not layers:
        raise ValueError("no classifier layer ([C, D] weight, [C] bias) of the base model is in the upload")
    names = [b or w for w, b in layers]
    change = _changes(arrays, base, names, spec)
    score = np.zeros(num_classes)
    for (w, b), name in zip(layers, names):
        delta = change[name]
        if b is not None and spec.kind == "topk":
            delta = _impute_dropped(delta)
        score += _numpy(delta if b is not None else delta.sum(dim=1))
    return score / len(layers)


def _impute_dropped(bias_change: torch.Tensor) -> torch.Tensor:
    """A top-k encoded bias change decodes the entries it dropped to 0; the server knows they were the smaller ones,
    and that a softmax cross-entropy bias gradient sums to 0 over the classes: it spreads minus the kept entries'
    sum evenly over the dropped ones (else every dropped class would read as 'no change', i.e. a share of 1/C)."""
    dropped = bias_change == 0
    if not dropped.any() or dropped.all():
        return bias_change
    filled = bias_change.clone()
    filled[dropped] = -bias_change[~dropped].sum() / dropped.sum()
    return filled


def sgd_scale(lr: float, momentum: float, steps: int) -> float:
    """How far `steps` SGD steps (heavy-ball momentum, from rest) move a parameter whose gradient is 1 throughout:
    step j adds lr * (1 - momentum^j) / (1 - momentum)."""
    return lr * sum((1 - momentum ** j) / (1 - momentum) if momentum else 1.0 for j in range(1, steps + 1))


def pfedme_scale(personal_lr: float, prox: float, eta: float, inner_steps: int, batches: int) -> float:
    """How far pFedMe's uploaded w moves under a gradient of 1 throughout: per batch, theta takes `inner_steps`
    steps on (1 + prox * (theta - w)), then w <- w - eta * prox * (w - theta) (its L2 term ignored)."""
    theta = w = 0.0
    for _ in range(batches):
        for _ in range(inner_steps):
            theta -= personal_lr * (1.0 + prox * (theta - w))
        w -= eta * prox * (w - theta)
    return -w


def update_scale(method: str, params, num_samples: int) -> float:
    """lambda: how far a client's local update moves a classifier bias per unit of mean gradient, from the run's
    params (pipeline.config.Params: what the server knows of the protocol) and the client's uploaded sample count."""
    t = params.train
    batches = math.ceil(num_samples / t.batch_size) * t.local_epochs
    if method == "pfedme":
        p = params.pfedme
        return pfedme_scale(p.personal_lr, p.lambda_, p.eta, p.K, batches)
    return sgd_scale(t.lr, t.momentum, batches)


def _averaging(method: str, uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    """LLG's normalised negative classifier gradient, from the round's model upload (the latest recorded)."""
    models = [p for p in uploads if p.kind == "params" or p.kind.startswith("block")]
    if not models:
        return Estimate(None, NOTHING)
    base = context.get("base")
    if base is None:
        raise ValueError("a model upload is compared with the model the server sent: pass it as context['base'] "
                         "(the global state dict, as the server held it when it configured the round)")
    # one round's upload: every payload of the last round's kinds (FedAlt sends a payload per block)
    last_kind = models[-1].kind
    round_payloads = models if last_kind.startswith("block") else [models[-1]]
    arrays: dict[str, torch.Tensor] = {}
    for p in round_payloads:  # later payloads (a later round) overwrite earlier ones of the same tensors
        arrays.update(p.arrays)
    score = classifier_scores(arrays, base, num_classes, _spec(context))
    scale = context.get("scale")
    if scale is None and context.get("params") is not None:
        count = _latest(uploads, SAMPLE_COUNT)
        if count is not None:
            scale = update_scale(method, context["params"], int(_numpy(count.arrays[SAMPLE_COUNT]).ravel()[0]))
    if scale is None:  # the step size unknown: the classes whose bias rose, by how much
        rose = np.clip(score, 0.0, None)
        note = "uncalibrated (no params or scale in context)" + ("" if rose.sum() > 0 else "; no bias rose: uniform")
        return Estimate(_normalised(rose), CLASSIFIER, note)
    # s ~= scale * (pi - 1/C): a uniform prediction prior, then the share that implies
    return Estimate(_normalised(np.clip(1.0 / num_classes + score / scale, 0.0, None)), CLASSIFIER)


def _local(uploads: list[Payload], num_classes: int, context: dict) -> Estimate:
    return Estimate(None, NOTHING, "local-only training sends nothing")


ESTIMATORS = {"fedcache": _fedcache, "fd": _fd, "fedproto": _fedproto, "local": _local, "pdfl": _pdfl,
              **{m: _gkt for m in GKT}, **{m: partial(_averaging, m) for m in AVERAGING}}


def estimate_mix(method: str, uploads: list[Payload], num_classes: int, context: dict | None = None) -> Estimate:
    """The server's estimate of one client's class mix from the payloads it recorded from that client (any
    rounds, in arrival order). `context`: what the server knows besides them: "encode_up" (the method's
    upload encoding, a string or Spec; float32 when absent) and, for the parameter-averaging methods, "base"
    (the state the client started that round from, as the server knows it: the global state it sent; for FedAlt
    the blocks it sent and, for the others, the client's own from its previous upload) with "params" (the
    run's Params: the step size is derived from them and the uploaded sample count) or "scale" (that step size,
    `update_scale`); without either, the uncalibrated estimate."""
    if method not in ESTIMATORS:
        raise ValueError(f"no label-mix estimator for method {method!r}; known: {sorted(ESTIMATORS)}")
    if not uploads:
        return Estimate(None, NOTHING)
    return ESTIMATORS[method](uploads, num_classes, context or {})


# -- scoring ------------------------------------------------------------------------------------------------------


def total_variation(p, q) -> float:
    """TV(p, q) = 0.5 * sum |p - q|: 0 for the same mix, 1 for mixes on disjoint classes."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"mixes of different shapes: {p.shape} and {q.shape}")
    return 0.5 * float(np.abs(p - q).sum())


def over_clients(estimates, true_mixes) -> dict:
    """Score a run's estimates (a list, or a dict by client) against the clients' true mixes (same layout).

    Returns: tv (mean TV over the clients with an estimate) with tv_low / tv_high (95% bootstrap over clients),
    n_clients (clients scored), uniform_tv (the mean TV of guessing a uniform mix, over the same clients: what an
    attacker with nothing scores) with its interval, advantage = uniform_tv - tv with its interval (paired by
    client: above 0, the uploads leak more than nothing), and hows (where the estimates came from). With no
    estimate at all (nothing uploaded) the TV figures are None and the uniform baseline covers every client."""
    keys = sorted(estimates) if isinstance(estimates, dict) else range(len(estimates))
    if len(keys) != len(true_mixes):
        raise ValueError(f"{len(keys)} estimates for {len(true_mixes)} true mixes")
    scored = [k for k in keys if estimates[k].mix is not None]
    kept = scored or list(keys)
    truth = [np.asarray(true_mixes[k], dtype=np.float64) for k in kept]
    uniform = np.array([total_variation(np.full(len(t), 1.0 / len(t)), t) for t in truth])
    out = {"n_clients": len(scored), "hows": sorted({estimates[k].how for k in keys})}
    out["uniform_tv"], out["uniform_tv_low"], out["uniform_tv_high"] = mean_interval(uniform)
    if not scored:
        return {**out, "tv": None, "tv_low": None, "tv_high": None,
                "advantage": None, "advantage_low": None, "advantage_high": None}
    tv = np.array([total_variation(estimates[k].mix, t) for k, t in zip(kept, truth)])
    out["tv"], out["tv_low"], out["tv_high"] = mean_interval(tv)
    out["advantage"], out["advantage_low"], out["advantage_high"] = mean_interval(uniform - tv)
    return out


__all__ = ["Estimate", "classifier_layers", "classifier_scores", "estimate_mix", "mix_of_labels", "over_clients",
           "pfedme_scale", "sgd_scale", "total_variation", "update_scale"]
