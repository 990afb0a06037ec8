"""The audit of one finished run: each attack that applies to its method, on what its training kept
(pipeline/train/capture.py), scored over the audited clients with 95% intervals (docs/privacy.md).

The attacker's public data: training-set samples no client trains on and no split uses (the unused training
samples of a scaled-down partition; a full-data partition leaves none, and the attacks that need them say so).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline import paths
from pipeline.audit import feature_inversion, gradient_inversion, label_mix, membership, reconstruction
from pipeline.audit.image_scores import psnr_ssim
from pipeline.config import Params
from pipeline.data.datasets import ImageDataset
from pipeline.data.partition import Partition
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.averaging import decode_state
from pipeline.federation.clients import build_clients, model_name
from pipeline.federation.ledger import SETUP_ROUND, Payload
from pipeline.index.encoder import build_encoder, encode
from pipeline.methods.registry import method_class
from pipeline.results.intervals import mean_interval
from pipeline.seeds import rng
from pipeline.train import capture, checkpoint

CODE_METHODS = ("fedcache",)  # the server holds every sample's code: the code-inversion attack applies
# the server holds the client's model (MTFL: its shared tensors) after its update: gradient inversion
GRADIENT_METHODS = ("fedavg", "mtfl", "pfedme", "fedalt")
FEATURE_METHODS = ("feddkc", "fedict")  # the server holds per-sample stem features: feature inversion
# clients whose last-round features are inverted (an inverter each, trained on that client's own final stem: about
# a minute a client at 28 x 28 on 2 busy cores); a constant until the audit section has its own param
FEATURE_CLIENTS = 2


def public_index(part: Partition, dataset_size: int, limit: int, seed: int) -> np.ndarray:
    """Up to `limit` training-set indices no client trains on and no split uses, seeded."""
    used = np.concatenate([part.train_index, part.val_index])
    unused = np.setdiff1d(np.arange(dataset_size), used)
    return np.sort(rng(seed, "audit-public").permutation(unused)[:limit])


def _interval(values: np.ndarray) -> dict:
    """mean with its 95% bootstrap interval over clients (values: one per client)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return {"mean": float(values.mean()) if len(values) else None, "low": None, "high": None, "n": len(values)}
    mean, low, high = mean_interval(values)
    return {"mean": mean, "low": low, "high": high, "n": len(values)}


def _payloads(records: list[dict], every_label: bool = False) -> list[Payload]:
    """The kept payloads; `every_label`: a per-sample payload's labels are every label it carried (the capture keeps
    them whole, `all_labels`, beside the sampled rows), as the server received them."""
    out = []
    for r in records:
        arrays = {n: torch.as_tensor(a) for n, a in r["arrays"].items() if n != "all_labels"}
        if every_label and "all_labels" in r["arrays"]:
            arrays["labels"] = torch.as_tensor(r["arrays"]["all_labels"])
        out.append(Payload(r["kind"], arrays))
    return out


# -- reconstruction -------------------------------------------------------------------------------------------------


def _code_inversion(params: Params, part: Partition, ds: ImageDataset, setup: dict, public: np.ndarray) -> dict:
    """The curious FedCache server inverts the codes it holds: an inverter trained on public images and their codes
    (the encoder is fixed and known), applied to the audited clients' codes; PSNR / SSIM against their images,
    beside the attacker who ignores the codes (the mean public image)."""
    if len(public) < 100:
        return {"applies": False, "why": f"only {len(public)} public samples (a full-data partition leaves none)"}
    a = params.audit
    encoder = build_encoder(params.encode, ds.train_x.shape[1:], params.seed)
    public_codes = encode(encoder, ds.train_x[public], params.encode.batch_size, params.encode.dtype)
    inverter = reconstruction.train_inverter(public_codes, ds.train_x[public], epochs=a.inverter_epochs,
                                             seed=params.seed, encoder_name=params.encode.encoder)
    per_client: dict[str, list[float]] = {"psnr": [], "ssim": [], "baseline_psnr": [], "baseline_ssim": []}
    for k, records in sorted(setup.items()):
        [hashes] = [r for r in records if r["kind"] == "hashes"]
        images = ds.train_x[part.train_index[hashes["arrays"]["sample_ids"]]]
        psnr, ssim = psnr_ssim(images, reconstruction.invert(inverter, hashes["arrays"]["codes"]))
        base_psnr, base_ssim = psnr_ssim(images, reconstruction.mean_image_baseline(ds.train_x[public], len(images)))
        for name, v in (("psnr", psnr), ("ssim", ssim), ("baseline_psnr", base_psnr), ("baseline_ssim", base_ssim)):
            per_client[name].append(float(v.mean()))
    return {"applies": True, "attack": "code inversion (learned inverter on public codes)",
            "encoder": params.encode.encoder, "public_samples": int(len(public)),
            **{name: _interval(np.array(v)) for name, v in per_client.items()}}


def _best_match(recovered: np.ndarray, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(PSNR, SSIM) of each recovered image against the client's training image it is closest to (PSNR): DLG's
    dummies come back in no particular order."""
    best_psnr, best_ssim = np.full(len(recovered), -np.inf), np.zeros(len(recovered))
    for i, r in enumerate(recovered):
        psnr, ssim = psnr_ssim(images, np.repeat(r[None], len(images), axis=0))
        j = int(np.argmax(psnr))
        best_psnr[i], best_ssim[i] = psnr[j], ssim[j]
    return best_psnr, best_ssim


def update_as_gradient(params: Params, client, first: dict, down, method: str = "fedavg"
                       ) -> tuple[torch.nn.Module, dict]:
    """(the model the client started round 1 from, as the server knows it; the client's round-1 update read as
    one gradient of it, for the tensors the server holds): the weight change over the round's local steps divided
    by their effective step.

    What the server knows, per method. FedAvg, pFedMe: the whole model it sent. MTFL: the shared tensors it sent;
    the client's BatchNorm stays private, and in round 1 it is the client's initial BatchNorm (every client's model
    is built from the seed, as the server can build it); the upload carries the shared tensors only, so only those
    have a gradient here. FedAlt: the first m_k blocks it sent over the client's other blocks, which in round 1
    are the initial global model's (all clients start from it); the client uploads all its blocks. The reading:
    FedAvg, MTFL, FedAlt run the train section's SGD with a fresh momentum in round 1 (`delta_as_gradient`);
    pFedMe's w moves by its own rule (`pfedme_delta_as_gradient`, derived there).
    """
    t = params.train
    model = client.model
    model.load_state_dict(_round_start(model.state_dict(), _payloads(first["downloads"][client.id]), down))
    sent = {n: v.detach().clone() for n, v in model.state_dict().items()}
    uploaded = {n: a for p in _payloads(first["uploads"][client.id]) if _is_model(p.kind) for n, a in p.arrays.items()}
    delta = {n: uploaded[n] - sent[n] for n, _ in model.named_parameters() if n in uploaded}
    batches = -(-client.num_train // t.batch_size) * t.local_epochs
    if method == "pfedme":
        p = params.pfedme
        return model, gradient_inversion.pfedme_delta_as_gradient(
            delta, sent, personal_lr=p.personal_lr, lambda_=p.lambda_, mu=p.mu, eta=p.eta, K=p.K, batches=batches)
    return model, gradient_inversion.delta_as_gradient(delta, t.lr, batches, t.momentum)


def client_loss(params: Params, method: str):
    """The loss a method's clients take their round-1 steps on, as DLG's `loss` (targets hard or soft labels):
    cross-entropy, or FedAlt's CE on every exit with block-level self-distillation (its round-1 weight)."""
    if method != "fedalt":
        return gradient_inversion.cross_entropy_loss
    # FedAlt's own code, reached through the registry by name as training reaches it: an audit stage depends on its
    # own method's folder only (dvc.yaml), so no other method's audit imports FedAlt's module
    fedalt = sys.modules[method_class(method).__module__]
    cfg = params.fedalt
    lam = fedalt.distill_weight(cfg, 1)
    return lambda model, x, y: fedalt.fedalt_loss_rows(model.forward_all(x), y, lam, cfg.T,
                                                       cfg.distill == "two_way").mean()


def _gradient_inversion(params: Params, method: str, part: Partition, ds: ImageDataset, run_dir: Path,
                        public: np.ndarray, clients: dict, initial: dict) -> dict:
    """The curious server (FedAvg, MTFL, pFedMe, FedAlt) inverts a client's round-1 update: its weight change read
    as one gradient (update_as_gradient), DLG on a dummy batch of the client's batch size from the model it knows,
    under the method's loss, matching the gradients of the tensors the client uploaded; each recovered image scored
    against the client's training image it is closest to, beside the mean public image so scored."""
    a, t = params.audit, params.train
    section = getattr(params, method)
    up, down = (parse_encoding(getattr(section, key, "float32")) for key in ("encode_up", "encode_down"))
    if not up.lossless:
        return {"applies": False, "why": f"{method}.encode_up = {up}: an encoded update is not inverted yet"}
    first = capture.load_uploads(run_dir, 1)
    rows: dict[str, list[float]] = {"psnr": [], "ssim": [], "baseline_psnr": [], "baseline_ssim": []}
    mean_image = ds.train_x[public].astype(np.float64).mean(axis=0)[None] / 255.0
    for k in sorted(first["uploads"])[: a.dlg_clients]:
        client = clients[k]
        client.model.load_state_dict(initial[k])  # as the client started; the server's download goes over it
        model, grads = update_as_gradient(params, client, first, down, method)
        batch = min(t.batch_size, client.num_train)
        found = gradient_inversion.dlg(model.train(), grads, None, (batch, *client.x_train.shape[1:]),
                                       steps=a.dlg_steps, seed=params.seed, lr=0.1, optimizer="adam",
                                       loss=client_loss(params, method), match=set(grads))
        images = ds.train_x[part.client_train(k)]
        for prefix, recovered in (("", found.images), ("baseline_", mean_image.astype(np.float32))):
            psnr, ssim = _best_match(recovered, images)
            rows[prefix + "psnr"].append(float(psnr.mean()))
            rows[prefix + "ssim"].append(float(ssim.mean()))
    return {"applies": True, "attack": "gradient inversion (DLG on the round-1 update read as one gradient)",
            "clients": len(rows["psnr"]), "batch": t.batch_size, "dlg_steps": a.dlg_steps,
            **({"approximate": APPROXIMATE[method]} if method in APPROXIMATE else {}),
            **{name: _interval(np.array(v)) for name, v in rows.items()}}


APPROXIMATE = {  # where the update read as one gradient rests on more than FedAvg's constant-gradient reading
    "mtfl": "only the shared tensors' gradients are matched (the BatchNorm stays the client's); the server uses the "
            "client's initial BatchNorm, which is the one it trained from in round 1",
    "pfedme": "w moves by pFedMe's rule (K personal steps per batch, then w toward theta), read back under the "
              "constant-gradient approximation (exact for one batch with K = 1)",
    "fedalt": "DLG matches the gradient of FedAlt's multi-exit loss with self-distillation, not cross-entropy alone",
}


def _feature_inversion(params: Params, method: str, part: Partition, ds: ImageDataset, run_dir: Path,
                       public: np.ndarray, clients: dict) -> dict:
    """The curious FedDKC / FedICT server, colluding with the holder of a client's final model, inverts the stem
    features the client uploaded in the last round (pipeline/audit/feature_inversion.py): an inverter trained on
    that model's stem run on public images, decoded as the server decodes uploads; PSNR / SSIM against the client's
    images, beside the mean public image."""
    from pipeline.federation import gkt
    from pipeline.federation.clients import to_tensor

    if len(public) < 100:
        return {"applies": False, "why": f"only {len(public)} public samples (a full-data partition leaves none)"}
    a = params.audit
    up = parse_encoding(getattr(params, method).encode_up)
    last = capture.captured_rounds(run_dir)[-1]
    uploads = capture.load_uploads(run_dir, last)["uploads"]
    models = final_models(clients, run_dir)
    public_images = ds.train_x[public]
    rows: dict[str, list[float]] = {"psnr": [], "ssim": [], "baseline_psnr": [], "baseline_ssim": []}
    for k in [k for k in sorted(uploads) if any(r["kind"] == "features" for r in uploads[k])][:FEATURE_CLIENTS]:
        [sent] = [r["arrays"] for r in uploads[k] if r["kind"] == "features"]
        arrays = {n: torch.as_tensor(v) for n, v in sent.items() if n not in ("all_labels", "positions")}
        shape = tuple(models[k].stem(to_tensor(public_images[:1])).shape[1:])

        def extract(images: np.ndarray, model=models[k], shape=shape) -> np.ndarray:
            """The stem's features of `images` as the server would receive them (encoded and decoded)."""
            feats, logits = gkt.stem_features_and_logits(model, to_tensor(images), params.train.eval_batch_size)
            parts = {**gkt.encode_upload(up, feats, logits), "labels": torch.zeros(len(images), dtype=torch.long)}
            return gkt.decode_upload(up, parts, shape, ds.num_classes)["features"].numpy()

        features = gkt.decode_upload(up, arrays, shape, ds.num_classes)["features"].numpy()
        recovered, _ = feature_inversion.invert_features(extract, public_images, features,
                                                         epochs=a.inverter_epochs, seed=params.seed)
        images = ds.train_x[part.client_train(k)[sent["positions"]]]
        for prefix, guess in (("", recovered), ("baseline_", reconstruction.mean_image_baseline(public_images,
                                                                                                  len(images)))):
            psnr, ssim = psnr_ssim(images, guess)
            rows[prefix + "psnr"].append(float(psnr.mean()))
            rows[prefix + "ssim"].append(float(ssim.mean()))
    if not rows["psnr"]:
        return {"applies": False, "why": f"no audited client uploaded features in the last round ({last})"}
    return {"applies": True, "attack": "feature inversion (server with a client's final model: inverter on its stem's "
                                       "public features, applied to its last-round uploads)",
            "clients": len(rows["psnr"]), "round": last, "public_samples": int(len(public)),
            **{name: _interval(np.array(v)) for name, v in rows.items()}}


def _reconstruction(params: Params, method: str, part: Partition, ds: ImageDataset, run_dir: Path,
                    public: np.ndarray, clients: dict, initial: dict) -> dict:
    if method in CODE_METHODS:
        setup = capture.load_uploads(run_dir, SETUP_ROUND)["uploads"]
        return _code_inversion(params, part, ds, setup, public)
    if method in GRADIENT_METHODS:
        return _gradient_inversion(params, method, part, ds, run_dir, public, clients, initial)
    if method in FEATURE_METHODS:
        return _feature_inversion(params, method, part, ds, run_dir, public, clients)
    return {"applies": False, "why": NO_RECONSTRUCTION.get(method, "not audited yet: no reconstruction attack reads "
                                                                     "this method's uploads")}


NO_RECONSTRUCTION = {  # the methods whose server holds no per-sample payload and no model update
    "fd": "its uploads are per-class mean logits: no one sample's image is in them (inverting a class's mean to a "
          "representative image is not audited yet)",
    "fedproto": "its uploads are per-class mean features (prototypes): no one sample's image is in them (inverting "
                "a class's prototype to a representative image is not audited yet)",
    "local": "nothing is uploaded",
    "pdfl": "its models and knowledge go client to client; the server receives nothing of a client's to invert",
}


# -- membership -----------------------------------------------------------------------------------------------------


def _membership(params: Params, part: Partition, ds: ImageDataset, run_dir: Path, hetero: bool,
                public: np.ndarray, clients: dict) -> dict:
    """A third party holding a client's final model: loss threshold (Yeom et al.) and offline LiRA (shadows trained
    on public data by the clients' own optimiser settings) on its members against same-mix non-members."""
    a = params.audit
    models = final_models(clients, run_dir)
    candidates = {k: membership.membership_candidates(ds, part, k, public, params.seed, max_members=a.members)
                  for k in models}
    # the shadows' data: public samples no client's candidates use (offline LiRA: every candidate is OUT)
    taken = [c.public_used for c in candidates.values()]
    pool = np.setdiff1d(public, np.concatenate(taken)) if taken else public
    shadows: dict[str, list] = {}  # one set of shadows an architecture
    scores = []
    for k, model in models.items():
        name = model_name(params, k, hetero)
        if a.shadow_models and name not in shadows:
            shadows[name] = _shadows(params, model, ds, pool)
        if len(candidates[k].member_y):
            scores.append(membership.score_client(model, candidates[k], shadows.get(name)))
    out: dict = {"applies": bool(scores), "members_per_client": a.members}
    for attack in ("loss", "lira"):
        rows = [s[attack] for s in scores if attack in s]
        if rows:
            out[attack] = membership.over_clients(rows)
    if "lira" in out:
        out["lira"].update(shadow_models=a.shadow_models, shadow_epochs=a.shadow_epochs, shadow_samples=len(pool) // 2)
    return out


SHADOWS = paths.CHECKPOINTS / "shadows"  # the shadows' cache: the audit stages of one dataset share them


def _shadows(params: Params, target: torch.nn.Module, ds: ImageDataset, pool: np.ndarray) -> list[torch.nn.Module]:
    """Offline LiRA's shadow models of the target's architecture, trained on `pool` with the clients' optimiser
    settings; trained once and kept (SHADOWS, keyed by everything that makes them), so the audits of the methods
    sharing an architecture (FedCache, FD, FedAvg, local: ResNet-8) share them. They are a function of that key:
    a kept set is what training would give again."""
    import hashlib

    from filelock import FileLock

    a, t = params.audit, params.train
    shapes = sorted((n, tuple(v.shape)) for n, v in target.state_dict().items())
    code = Path(membership.__file__).read_bytes()  # an edit of how shadows train makes new ones
    key = hashlib.sha256(code + json.dumps([shapes, ds.name, pool.tolist(), a.shadow_models, a.shadow_epochs, t.lr,
                                            t.batch_size, params.seed, t.momentum, t.weight_decay]).encode()
                         ).hexdigest()[:16]
    path = SHADOWS / f"{key}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):  # audits running side by side (queued experiments) train them once
        if path.is_file():
            states = checkpoint.read(path, "delete it: the next audit trains the shadows again")["shadows"]
            shadows = [_fresh(target) for _ in states]
            for shadow, state in zip(shadows, states):
                shadow.load_state_dict(state)
            return [s.eval() for s in shadows]
        shadows = membership.train_shadow_models(
            lambda: _fresh(target), ds.train_x[pool], ds.train_y[pool], a.shadow_models, a.shadow_epochs, t.lr,
            t.batch_size, params.seed, t.momentum, t.weight_decay)
        checkpoint.save(path, {"shadows": [s.state_dict() for s in shadows]})
        return shadows


def final_models(clients: dict, run_dir: Path) -> dict[int, torch.nn.Module]:
    """The audited clients' final models: their models as training built them (`prepared_clients`) loaded with the
    weights the run kept."""
    states = capture.load_models(run_dir)
    out = {}
    for k, state in sorted(states.items()):
        clients[k].model.load_state_dict(state)
        out[k] = clients[k].model.eval()
    return out


def prepared_clients(params: Params, method: str, part: Partition, ds: ImageDataset, hetero: bool) -> dict:
    """Every client as training built it before round 1 (its initial model, shaped by the method)."""
    local = method_class(method).client_cls(params, ds.num_classes)
    clients = build_clients(params, part, ds, torch.device("cpu"), hetero)
    for c in clients:
        local.prepare(c)
    return {c.id: c for c in clients}


def _fresh(model: torch.nn.Module) -> torch.nn.Module:
    """A shadow: the target's architecture with freshly initialised weights."""
    import copy

    shadow = copy.deepcopy(model)
    for module in shadow.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return shadow.train()


# -- label mix ------------------------------------------------------------------------------------------------------


def _label_mix(params: Params, method: str, part: Partition, run_dir: Path, initial: dict) -> dict:
    """What the server estimates of each audited client's class mix from its uploads (the set-up and round 1; a
    model upload read against the model the client started the round from, which the server knows)."""
    if method not in label_mix.ESTIMATORS:  # a method added since: audited once its uploads have an estimator
        return {"applies": False, "why": f"no label-mix estimator for {method}'s uploads yet (pipeline/audit/label_mix.py)"}
    setup, first = (capture.load_uploads(run_dir, r) for r in (SETUP_ROUND, 1))
    section = getattr(params, method, None)
    down = parse_encoding(getattr(section, "encode_down", "float32"))
    estimates, truths = {}, {}
    for k in sorted(first["uploads"]):
        uploads = _payloads(setup["uploads"].get(k, []), every_label=True) + _payloads(first["uploads"][k], True)
        # what the server knows besides the uploads: the encoding and the params (the step size a model update
        # is read with), and, for a model upload, the model the client started round 1 from
        context = {"encode_up": getattr(section, "encode_up", "float32"), "params": params,
                   "base": _round_start(initial[k], _payloads(first["downloads"].get(k, [])), down)}
        estimates[k] = label_mix.estimate_mix(method, uploads, part.num_classes, context)
        lo, hi = part.train_offsets[k], part.train_offsets[k + 1]
        truths[k] = label_mix.mix_of_labels(part.train_labels[lo:hi], part.num_classes)
    return label_mix.over_clients(estimates, truths)


MODEL_KINDS = ("params", "global")  # a whole shared state; FedAlt sends its blocks as block1, block2, ...


def _is_model(kind: str) -> bool:
    return kind in MODEL_KINDS or kind.startswith("block")


def _round_start(initial: dict, downloads: list[Payload], down) -> dict:
    """The state a client started round 1 from: its initial model (every method builds it from the seed, as the
    server can) with the tensors the server sent it over it, decoded as the client decodes them."""
    state = dict(initial)
    for p in downloads:
        if _is_model(p.kind):
            if down.lossless:
                state.update({n: t for n, t in p.arrays.items() if n in state})
            else:
                template = {n: t for n, t in initial.items() if any(a == n or a.startswith(n + ".") for a in p.arrays)}
                state.update(decode_state(down, p.arrays, template))
    return state


# -- the run --------------------------------------------------------------------------------------------------------


def audit_run(params: Params, method: str, part: Partition, ds: ImageDataset, run_dir: Path,
              hetero: bool = False) -> dict:
    """Every attack that applies to the run's method; a short `summary` line for the log."""
    a = params.audit
    public = public_index(part, len(ds.train_y), a.public, params.seed)
    clients = prepared_clients(params, method, part, ds, hetero)  # built once: each attack loads what it reads
    initial = {k: {n: t.detach().clone() for n, t in c.model.state_dict().items()} for k, c in clients.items()}
    result = {"run": run_dir.name, "method": method, "public_samples": int(len(public)),
              "label_mix": _label_mix(params, method, part, run_dir, initial),
              "reconstruction": _reconstruction(params, method, part, ds, run_dir, public, clients, initial),
              "membership": _membership(params, part, ds, run_dir, hetero, public, clients)}
    result["summary"] = summary_line(result)
    return result


def summary_line(result: dict) -> str:
    parts = []
    rec = result["reconstruction"]
    if rec.get("applies"):
        parts.append(f"reconstruction PSNR {rec['psnr']['mean']:.1f} dB (mean image {rec['baseline_psnr']['mean']:.1f})")
    loss = result["membership"].get("loss", {})
    if loss.get("auc") is not None:
        parts.append(f"MIA AUC {loss['auc']:.2f} (loss), {result['membership'].get('lira', {}).get('auc', float('nan')):.2f} (LiRA)")
    mix = result["label_mix"]
    if mix.get("tv") is not None:
        parts.append(f"label-mix TV {mix['tv']:.2f} (uniform guess {mix['uniform_tv']:.2f})")
    return "; ".join(parts) or "nothing to attack"
