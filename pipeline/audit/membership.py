"""Membership inference on a client's final model, played by a third party who holds that model.

Two attacks, both black-box on the model's outputs for a candidate sample and its label:

- **Loss threshold** (Yeom, Giacomelli, Fredrikson and Jha, "Privacy Risk in Machine Learning:
  Analyzing the Connection to Overfitting", IEEE CSF 2018): a sample the model trained on tends to
  have a lower loss, so the score is minus the cross-entropy loss. The attacker needs only the model
  and the candidate's label.
- **Offline LiRA** (Carlini, Chien, Nasr, Song, Terzis and Tramer, "Membership Inference Attacks From
  First Principles", IEEE S&P 2022): the attacker trains shadow models of the same architecture on
  its own public data (never a client's samples), so every candidate is OUT for every shadow. For
  each candidate it fits a Gaussian to the shadows' logit-scaled confidence phi = log p_y - log(1 - p_y)
  on it (how confident a model that did not see it is, sample by sample: hard samples stay hard), and
  scores the target's phi by how far it lies in that Gaussian's upper tail (one-sided test). With
  few shadows (under 64, as the paper does) the standard deviation is one pooled figure over all
  candidates rather than one per candidate. The attacker is assumed to know the architecture and the
  training recipe (plain SGD with momentum, as clients train) and to hold public data of the task.

Both report AUC and TPR at 1% FPR (the paper's point: an attack matters when it is confident about a
few samples, which the AUC averages away), averaged over clients with 95% bootstrap intervals.

Everything here is pure torch / numpy / scipy / scikit-learn: inputs are plain arrays and modules, so
the audit stage calls it and tests drive it directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.data.datasets import ImageDataset
from pipeline.data.partition import Partition
from pipeline.federation.clients import to_tensor
from pipeline.results.intervals import mean_interval
from pipeline.seeds import rng

GLOBAL_STD_BELOW = 64  # the paper fits one global std when it has fewer shadow models than this
LOW_FPR = 0.01


# ----------------------------------------------------------------------------------------------------
# What the model says about a candidate


def _inputs(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 images (as the datasets hold them) -> the float tensor a client's model reads; float input is
    taken as already scaled and shaped [N, C, H, W]."""
    if isinstance(x, np.ndarray):
        return to_tensor(x) if x.dtype == np.uint8 else torch.from_numpy(np.ascontiguousarray(x)).float()
    return x.float()


def _logits(model: nn.Module, x: np.ndarray | torch.Tensor, batch_size: int = 256) -> np.ndarray:
    """The model's logits [N, C] in float64, in eval mode without gradients; the model's mode is restored."""
    inputs = _inputs(x)
    if len(inputs) == 0:
        raise ValueError("no candidate sample to score")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = [model(inputs[i : i + batch_size].to(device)).double().cpu() for i in range(0, len(inputs), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(out).numpy()


def _labels(y: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y, dtype=np.int64)


def per_sample_losses(model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                      batch_size: int = 256) -> np.ndarray:
    """Cross-entropy of each sample under the model (eval mode, no gradients): float64 [N]."""
    z = torch.from_numpy(_logits(model, x, batch_size))
    return F.cross_entropy(z, torch.from_numpy(_labels(y)), reduction="none").numpy()


def true_class_confidence(model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                          batch_size: int = 256) -> np.ndarray:
    """LiRA's logit-scaled confidence phi = log p_y - log(1 - p_y) per sample: float64 [N].

    From logits z it is z_y - logsumexp_{j != y} z_j (the softmax normaliser cancels), which stays finite
    where p_y rounds to 1 and log(1 - p_y) would not. Note the loss is softplus(-phi): the two are one
    monotone function of each other, so on a single model they rank samples identically."""
    z = torch.from_numpy(_logits(model, x, batch_size))
    y = torch.from_numpy(_labels(y))
    true = z.gather(1, y[:, None]).squeeze(1)
    others = z.scatter(1, y[:, None], float("-inf"))  # drop the true class from the normaliser
    return (true - torch.logsumexp(others, dim=1)).numpy()


# ----------------------------------------------------------------------------------------------------
# The two attacks: a score per candidate, higher = "more likely a member"


def loss_threshold_scores(model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                          batch_size: int = 256) -> np.ndarray:
    """Yeom et al.'s attack: minus the loss (any threshold on it is a point of the ROC curve)."""
    return -per_sample_losses(model, x, y, batch_size)


def train_shadow_models(build_model: Callable[[], nn.Module], public_x: np.ndarray | torch.Tensor,
                        public_y: np.ndarray | torch.Tensor, n_models: int, epochs: int, lr: float,
                        batch_size: int, seed: int, momentum: float = 0.9, weight_decay: float = 0.0,
                        device: str | torch.device = "cpu") -> list[nn.Module]:
    """Shadow models for offline LiRA, each trained on its own random half of the public data.

    `build_model()` returns a fresh model of the target's architecture; training is plain SGD with momentum
    and cross-entropy, as the clients' local training. Seeded by `seed` (initialisation and batches per
    shadow, from named streams), without touching torch's global random state. The candidates must not be in
    the public data: offline LiRA treats every candidate as OUT for every shadow."""
    inputs, labels = _inputs(public_x), torch.from_numpy(_labels(public_y))
    shadows = []
    for m in range(n_models):
        draw = rng(seed, "audit-shadow", m)
        half = np.sort(draw.permutation(len(labels))[: len(labels) // 2])
        with torch.random.fork_rng(devices=[]):  # the init draws from a seeded global state, restored after
            torch.manual_seed(int(draw.integers(2**62)))
            model = build_model()
        model.to(device).train()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        # full batches, the partial one (if any) first, as the clients' batch_order does
        cuts = np.arange(len(half) % batch_size or batch_size, len(half), batch_size)
        for _ in range(epochs):
            for batch in np.split(draw.permutation(half), cuts):
                xb, yb = inputs[batch].to(device), labels[batch].to(device)
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
        shadows.append(model.eval())
    return shadows


@dataclass(frozen=True)
class OutDistribution:
    """Per candidate, the Gaussian fitted to the shadows' phi on it (all shadows OUT)."""

    mean: np.ndarray  # [N]
    std: np.ndarray  # [N] (one value repeated when the std is global)
    global_std: bool


def fit_out_distribution(shadow_phi: np.ndarray, global_std_below: int = GLOBAL_STD_BELOW) -> OutDistribution:
    """Gaussian per candidate from the shadows' phi [n_shadows, N].

    With fewer shadows than `global_std_below` one std for all candidates: the pooled within-candidate
    spread (deviations from each candidate's own mean), which a handful of shadows estimates far better than
    N separate stds. One shadow gives no spread at all: LiRA needs at least two."""
    shadow_phi = np.asarray(shadow_phi, dtype=np.float64)
    n_shadows = shadow_phi.shape[0]
    if n_shadows < 2:
        raise ValueError(f"offline LiRA needs at least 2 shadow models to estimate a spread, got {n_shadows}")
    mean = shadow_phi.mean(axis=0)
    if n_shadows < global_std_below:
        pooled = float(np.sqrt(np.mean((shadow_phi - mean) ** 2) * n_shadows / (n_shadows - 1)))
        return OutDistribution(mean, np.full_like(mean, pooled), True)
    return OutDistribution(mean, shadow_phi.std(axis=0, ddof=1), False)


def lira_offline_scores(target: nn.Module, shadows: list[nn.Module], x: np.ndarray | torch.Tensor,
                        y: np.ndarray | torch.Tensor, global_std_below: int = GLOBAL_STD_BELOW,
                        batch_size: int = 256) -> np.ndarray:
    """Carlini et al.'s offline LiRA score per candidate: -log P[Z > phi_target], Z ~ N(mean_out, std_out).

    The one-sided test: a member's phi sits above what models that never saw it give. -logsf orders
    candidates exactly as the paper's CDF does but does not flatten to 1 deep in the tail (no ties among
    confidently memorised samples). Pass members and non-members in one call (`score_client` does): with
    a global std, the std is pooled over the candidates passed, and both sides must share it."""
    from scipy.stats import norm

    phi = true_class_confidence(target, x, y, batch_size)
    shadow_phi = np.stack([true_class_confidence(s, x, y, batch_size) for s in shadows])
    out = fit_out_distribution(shadow_phi, global_std_below)
    std = np.maximum(out.std, 1e-12)  # identical shadows: a degenerate spread, not a division by zero
    return -norm.logsf(phi, loc=out.mean, scale=std)


# ----------------------------------------------------------------------------------------------------
# Scoring an attack, one client and over clients


def attack_scores(member_scores: np.ndarray, nonmember_scores: np.ndarray) -> dict[str, float]:
    """AUC and TPR at FPR <= 1% (the largest TPR among ROC points whose FPR is at most 0.01) of scores
    where higher means "member". Every ROC point is kept: sklearn's default drops collinear ones, which
    can drop the point that decides the low-FPR figure."""
    from sklearn.metrics import roc_auc_score, roc_curve

    member_scores, nonmember_scores = np.asarray(member_scores, float), np.asarray(nonmember_scores, float)
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        raise ValueError("an attack needs at least one member and one non-member")
    is_member = np.r_[np.ones(len(member_scores)), np.zeros(len(nonmember_scores))]
    scores = np.r_[member_scores, nonmember_scores]
    fpr, tpr, _ = roc_curve(is_member, scores, drop_intermediate=False)
    return {"auc": float(roc_auc_score(is_member, scores)),
            "tpr_at_1pct_fpr": float(tpr[fpr <= LOW_FPR].max())}


def over_clients(per_client: list[dict]) -> dict[str, float | int]:
    """Mean AUC and mean TPR@1%FPR over clients (each client one attack_scores dict), each with a 95%
    percentile-bootstrap interval over clients (pipeline/results/intervals.py): what varies is which
    clients the partition made and which candidates each drew."""
    if not per_client:
        raise ValueError("no client to average over")
    n = len(per_client)
    out: dict[str, float | int] = {"n_clients": n}
    for key in ("auc", "tpr_at_1pct_fpr"):
        out[key], out[f"{key}_low"], out[f"{key}_high"] = mean_interval([c[key] for c in per_client])
    return out


def score_client(target: nn.Module, candidates: "Candidates", shadows: list[nn.Module] | None = None,
                 batch_size: int = 256) -> dict[str, dict[str, float]]:
    """Both attacks on one client's final model: {"loss": attack_scores, "lira": attack_scores} ("lira" only
    with shadows), members and non-members scored in one pass."""
    x = np.concatenate([candidates.member_x, candidates.nonmember_x])
    y = np.concatenate([candidates.member_y, candidates.nonmember_y])
    n = len(candidates.member_y)

    def split(scores: np.ndarray) -> dict[str, float]:
        return attack_scores(scores[:n], scores[n:])

    out = {"loss": split(loss_threshold_scores(target, x, y, batch_size))}
    if shadows:
        out["lira"] = split(lira_offline_scores(target, shadows, x, y, batch_size=batch_size))
    return out


# ----------------------------------------------------------------------------------------------------
# Who is a member


@dataclass(frozen=True)
class Candidates:
    """One client's members and an equally sized set of non-members with the same label mix."""

    member_x: np.ndarray  # uint8 images
    member_y: np.ndarray
    nonmember_x: np.ndarray
    nonmember_y: np.ndarray
    nonmember_source: np.ndarray  # str per non-member: "test", "val" or "public"
    public_used: np.ndarray  # training-set indices of the public samples taken as non-members


def membership_candidates(dataset: ImageDataset, partition: Partition, client: int, public_index: np.ndarray,
                          seed: int, max_members: int | None = None) -> Candidates:
    """Members: the client's training samples (a seeded random `max_members` of them when capped, to bound
    the audit's cost). Non-members, label by label in the members' counts: first the client's own test split
    (test-set images no client trains on), then its validation split (training-set images the run holds out
    from training), then public samples (`public_index`: training-set images no client trains on and no
    split uses) of that label; each source drawn in a seeded random order. None of these was trained on by
    any client, so a non-member is unseen by the final model whatever the method mixed in from other
    clients. Where a label still has too few non-members, its members are cut to the same number, so both
    sides keep the same size and the same label mix.

    The public samples taken here are returned in `public_used`: leave them out of the shadows' training
    data, or offline LiRA's "every candidate is OUT for every shadow" no longer holds for them."""
    draw = rng(seed, "audit-membership", client)
    members = partition.client_train(client)
    if max_members is not None and len(members) > max_members:
        members = np.sort(draw.choice(members, size=max_members, replace=False))
    pools = (("test", dataset.test_x, dataset.test_y, partition.client_test(client)),
             ("val", dataset.train_x, dataset.train_y, partition.client_val(client)),
             ("public", dataset.train_x, dataset.train_y, np.asarray(public_index, dtype=np.int64)))
    kept_members, non_x, non_y, source, public_used = [], [], [], [], []
    member_y = dataset.train_y[members]
    for label in np.unique(member_y):
        wanted = members[member_y == label]
        found = 0
        for name, xs, ys, index in pools:
            of_label = draw.permutation(index[ys[index] == label])[: len(wanted) - found]
            non_x.append(xs[of_label])
            non_y.append(ys[of_label])
            source += [name] * len(of_label)
            if name == "public":
                public_used.append(of_label)
            found += len(of_label)
        kept_members.append(np.sort(draw.permutation(wanted)[:found]))  # fewer only if no source had enough
    members = np.concatenate(kept_members) if kept_members else members[:0]
    empty_x = dataset.train_x[:0]
    return Candidates(dataset.train_x[members], dataset.train_y[members],
                      np.concatenate(non_x) if non_x else empty_x,
                      np.concatenate(non_y) if non_y else dataset.train_y[:0],
                      np.array(source, dtype=str),
                      np.sort(np.concatenate(public_used)) if public_used else np.zeros(0, np.int64))
