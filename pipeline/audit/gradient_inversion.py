"""Gradient inversion: a curious FedAvg-family server recovers a client's training images from its update.

Sources: Zhu, Liu & Han, "Deep Leakage from Gradients" (DLG), NeurIPS 2019: start from a random dummy
image (and dummy soft label), and optimise them so that the gradient they give on the shared model
matches the client's gradient in squared distance; and Zhao, Mopuri & Bilen, "iDLG: Improved Deep
Leakage from Gradients", arXiv 2020: for a batch of one sample trained with cross-entropy, the label can
be read off the last layer's weight gradient without any optimisation (see `infer_label_idlg`), after
which DLG only has to find the image.

The attacker is the honest-but-curious server of FedAvg, MTFL, FedAlt or pFedMe. It knows the model it
sent (its architecture and weights at the round's start), the loss the clients train with
(cross-entropy, or the method's own: `dlg`'s `loss`), the input shape and scaling
(pipeline.federation.clients.to_tensor: [-1, 1]), and the client's batch size; it receives the client's
new weights, or only some of them (MTFL keeps its BatchNorm layers: `dlg`'s `match` names the tensors whose
gradients the server holds, and only those are matched). It does not see data, labels or the client's
random state.

What the server sees is not a gradient: a client runs several local SGD steps, and the upload is its
weights after them. `delta_as_gradient` turns that change into the usual approximation of one gradient
(as if every step had taken the same gradient): exact for one step of plain SGD, increasingly rough as
the weights move during the round, and blind to weight decay. DLG on it therefore measures what this
approximation lets the server recover, a lower bound on what a stronger attack (one that simulates the
local steps) could.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# to_tensor's scaling (pipeline/federation/clients.py): pixel values in [0, 1] become model inputs in [-1, 1]
MODEL_INPUT_RANGE = (-1.0, 1.0)


# --- iDLG: the label of a single-sample update ---------------------------------------------------------

def infer_label_idlg(last_layer_weight_grad: torch.Tensor | np.ndarray) -> int:
    """The label of a one-sample batch, from the gradient of the last linear layer's weight [C, F].

    With cross-entropy, row c of that gradient is (p_c - [c = y]) * h, where p is the softmax output and h
    the layer's input. When h is non-negative (it follows a ReLU or sigmoid, as in ResNets and LeNets), the
    true label's row is the only one with negative entries (p_y - 1 < 0), every other row is non-negative.
    We take the row with the least sum, which is that row whenever h has any positive entry.
    Pass a gradient, not a weight change: `delta_as_gradient` first (a change has the opposite sign).
    """
    grad = torch.as_tensor(last_layer_weight_grad).detach().double()
    if grad.ndim != 2:
        raise ValueError(f"expected the last layer's weight gradient [classes, features], got shape {tuple(grad.shape)}")
    return int(grad.sum(dim=1).argmin())


def last_linear_weight_name(model: nn.Module) -> str:
    """The parameter name of the last nn.Linear's weight in `model` (the classifier head iDLG reads)."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer for iDLG to read")
    return f"{names[-1]}.weight" if names[-1] else "weight"


# --- what the server sees: a weight change, read as a gradient ---------------------------------------

def delta_as_gradient(delta: Mapping[str, torch.Tensor] | Sequence[torch.Tensor], lr: float, steps: int,
                      momentum: float = 0.0) -> dict[str, torch.Tensor] | list[torch.Tensor]:
    """A client's weight change (new - old) over `steps` local SGD steps, read as one gradient.

    The approximation: every local step took the same gradient g, so plain SGD moved the weights by
    -lr * steps * g, and g = -delta / (lr * steps). With heavy-ball momentum m started from zero velocity
    (FedAvg's fresh optimizer each round), the same constant g moves them by -lr * g * S with
    S = sum over t = 1..steps of (1 - m^t) / (1 - m); we divide by that instead. Weight decay is ignored.
    A dict (a state_dict's change) keeps its names; integer entries (BatchNorm's batch counter) are not
    gradients and are dropped. Returns float32 tensors.
    """
    if lr <= 0 or steps < 1 or not 0 <= momentum < 1:
        raise ValueError(f"need lr > 0, steps >= 1 and 0 <= momentum < 1; got lr={lr}, steps={steps}, momentum={momentum}")
    effective_steps = sum((1 - momentum**t) / (1 - momentum) for t in range(1, steps + 1))
    scale = -1.0 / (lr * effective_steps)

    def one(change) -> torch.Tensor:
        return torch.as_tensor(change).detach().float() * scale

    if isinstance(delta, Mapping):
        return {name: one(change) for name, change in delta.items() if torch.as_tensor(change).is_floating_point()}
    return [one(change) for change in delta]


def pfedme_delta_as_gradient(delta: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor], *,
                              personal_lr: float, lambda_: float, mu: float, eta: float, K: int,
                              batches: int) -> dict[str, torch.Tensor]:
    """pFedMe's change of its local copy w over a round (new - old), read as one gradient of cross-entropy.

    pFedMe's client (Dinh et al., NeurIPS 2020; pipeline/methods/pfedme/method.py) does not upload SGD steps
    on its loss: per batch it takes K steps on its personal model theta,
        theta <- theta - personal_lr * (g + lambda * (theta - w) + mu * theta),
    then moves w once, w <- w - eta * lambda * (w - theta), and uploads w; theta and w start the round at the
    model the server sent, w_0. Under the same approximation as `delta_as_gradient` (every step took the same
    gradient g), each coordinate's final w is linear in (w_0, g): w_N = A * w_0 + B * g, with scalars A and B
    that follow from running those two updates on the coefficients (they depend only on the params and the
    number of batches, all known to the server). So g = (w_N - A * w_0) / B, i.e. (delta - (A - 1) * w_0) / B.
    Exact for one batch with K = 1 (theta's one step takes the gradient at w_0, where the prox term is 0:
    w_1 = w_0 - eta * lambda * personal_lr * (g + mu * w_0)); with K > 1 or several batches theta moves and
    its later gradients differ, and the reading is the constant-gradient approximation. Float entries only.
    """
    if min(personal_lr, lambda_, eta) <= 0 or mu < 0 or K < 1 or batches < 1:
        raise ValueError("need personal_lr, lambda, eta > 0, mu >= 0, K >= 1 and batches >= 1")
    # coefficients (of w_0, of g) of w and theta, run through the round
    w, theta = (1.0, 0.0), (1.0, 0.0)
    for _ in range(batches):
        for _ in range(K):
            theta = tuple(t - personal_lr * (lambda_ * (t - v) + mu * t) for t, v in zip(theta, w))
            theta = (theta[0], theta[1] - personal_lr)
        w = tuple(v - eta * lambda_ * (v - t) for v, t in zip(w, theta))
    a, b = w
    return {name: ((torch.as_tensor(change).detach().double() - (a - 1.0) * torch.as_tensor(start[name]).double())
                   / b).float()
            for name, change in delta.items() if torch.as_tensor(change).is_floating_point()}


# --- DLG: optimise a dummy image until its gradient matches ------------------------------------------

@dataclass
class DLGResult:
    images: np.ndarray  # float32 [B, H, W] (grey) or [B, H, W, C], in [0, 1]: the recovered images
    labels: np.ndarray  # int64 [B]: the labels used (given) or the dummy soft labels' argmax (optimised)
    grad_distance: float  # the least squared gradient distance reached: near 0 when the match succeeded
    inputs: torch.Tensor  # [B, C, H, W]: the recovered images as model inputs


def _trainable(model: nn.Module, match: Collection[str] | None = None) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose gradients are matched: every trainable one, or those `match` names."""
    if match is not None:
        unknown = set(match) - {name for name, _ in model.named_parameters()}
        if unknown or not match:
            raise KeyError(f"match must name some of the model's parameters; unknown: {sorted(unknown)[:5]}")
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad and (match is None or name in match)]


def _aligned_targets(model: nn.Module, target_grads, match: Collection[str] | None = None) -> list[torch.Tensor]:
    """The target gradients in the order of the matched parameters."""
    params = _trainable(model, match)
    if isinstance(target_grads, Mapping):
        missing = [name for name, _ in params if name not in target_grads]
        if missing:
            raise KeyError(f"target gradients lack parameters {missing[:5]}")
        targets = [target_grads[name] for name, _ in params]
    else:
        targets = list(target_grads)
        if len(targets) != len(params):
            raise ValueError(f"{len(targets)} target gradients for {len(params)} trainable parameters")
    out = []
    for (name, p), g in zip(params, targets):
        g = torch.as_tensor(g).detach().to(device=p.device, dtype=p.dtype)
        if g.shape != p.shape:
            raise ValueError(f"target gradient of {name} has shape {tuple(g.shape)}, the parameter {tuple(p.shape)}")
        out.append(g)
    return out


Loss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The clients' loss of FedAvg, MTFL and pFedMe (whose prox term is 0 at the model the server sent): mean
    cross-entropy toward hard labels [B] or soft ones [B, C] (DLG's dummies; F.cross_entropy takes both)."""
    return F.cross_entropy(model(inputs), targets)


def model_gradient(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, loss: Loss = cross_entropy_loss,
                   match: Collection[str] | None = None) -> list[torch.Tensor]:
    """The gradient of the mean loss on (inputs, labels), per trainable parameter (or those `match` names): what
    one client step on that batch sends, the target DLG matches (also how tests plant a leak)."""
    params = [p for _, p in _trainable(model, match)]
    return [g.detach() for g in torch.autograd.grad(loss(model, inputs, labels), params)]


def to_unit_images(inputs: torch.Tensor, input_range: tuple[float, float] = MODEL_INPUT_RANGE) -> np.ndarray:
    """Model inputs [B, C, H, W] -> images in [0, 1]: [B, H, W] for one channel, [B, H, W, C] otherwise."""
    low, high = input_range
    unit = ((inputs.detach().float().cpu() - low) / (high - low)).clamp_(0.0, 1.0)
    unit = unit[:, 0] if unit.shape[1] == 1 else unit.permute(0, 2, 3, 1)
    return unit.numpy()


def dlg(model: nn.Module, target_grads, label: int | Sequence[int] | None, image_shape: Sequence[int],
        steps: int = 300, seed: int = 0, lr: float = 1.0, optimizer: str = "lbfgs",
        input_range: tuple[float, float] = MODEL_INPUT_RANGE, loss: Loss = cross_entropy_loss,
        match: Collection[str] | None = None) -> DLGResult:
    """Recover the batch behind `target_grads` (DLG; iDLG when `label` is given).

    `model`: the model as the server sent it (its mode as the client trained it: BatchNorm in train mode
    normalises by the batch's own statistics). `target_grads`: the gradient of mean cross-entropy per
    trainable parameter, a list in `model.named_parameters()` order or a dict by name (e.g.
    `delta_as_gradient` of a state_dict change). `label`: the batch's labels (one int for a batch of one,
    e.g. from `infer_label_idlg`), or None to optimise a dummy soft label per image as DLG does.
    `image_shape`: the batch's input shape [B, C, H, W]. `steps` optimiser steps: L-BFGS as in DLG, each
    step up to 20 evaluations, but with a strong-Wolfe line search (DLG's fixed step diverged on one of
    five seeds we tried); or "adam". `loss(model, inputs, targets)`: the clients' mean loss, targets hard labels
    or soft ones [B, C] (default: cross-entropy). `match`: the parameter names whose gradients the server holds
    (default: every trainable one); only those are matched, the others stay as sent.
    The attack runs on a copy: the model's weights and buffers are untouched.
    """
    if len(image_shape) != 4:
        raise ValueError(f"image_shape must be [B, C, H, W], got {tuple(image_shape)}")
    model = copy.deepcopy(model)  # a forward in train mode would move BatchNorm's running statistics
    params = [p for _, p in _trainable(model, match)]
    targets = _aligned_targets(model, target_grads, match)
    device = params[0].device
    gen = torch.Generator().manual_seed(seed)
    dummy = torch.randn(tuple(image_shape), generator=gen).to(device).requires_grad_(True)
    batch = image_shape[0]
    with torch.no_grad():
        num_classes = model(dummy).shape[1]
    if label is None:  # DLG: soft labels, optimised with the image
        dummy_label = torch.randn(batch, num_classes, generator=gen).to(device).requires_grad_(True)
        variables = [dummy, dummy_label]
    else:  # iDLG: the labels are known
        hard = torch.as_tensor(label, dtype=torch.long, device=device).reshape(-1)
        if len(hard) != batch:
            raise ValueError(f"{len(hard)} labels for a batch of {batch}")
        variables = [dummy]

    def gradient_distance() -> torch.Tensor:
        value = loss(model, dummy, F.softmax(dummy_label, dim=1) if label is None else hard)
        grads = torch.autograd.grad(value, params, create_graph=True)
        return sum(((g - t) ** 2).sum() for g, t in zip(grads, targets))

    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(variables, lr=lr, line_search_fn="strong_wolfe")
    elif optimizer == "adam":
        opt = torch.optim.Adam(variables, lr=lr)
    else:
        raise ValueError(f"optimizer must be 'lbfgs' or 'adam', got {optimizer!r}")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        distance = gradient_distance()
        distance.backward()
        return distance

    def snapshot() -> tuple[torch.Tensor, torch.Tensor]:
        labels = hard if label is not None else dummy_label.detach().argmax(dim=1)
        return dummy.detach().clone(), labels.clone()

    # A step returns the distance at the point it started from, so each distance is kept with that point.
    best_distance, best_point = float("inf"), snapshot()
    for _ in range(steps):
        before = snapshot()
        value = (opt.step(closure) if optimizer == "lbfgs" else _adam_step(opt, closure)).item()
        if not np.isfinite(value):  # L-BFGS can diverge; keep the best match found before that
            break
        if value < best_distance:
            best_distance, best_point = value, before
    else:
        final = float(gradient_distance().detach())  # the last step's end point
        if np.isfinite(final) and final < best_distance:
            best_distance, best_point = final, snapshot()
    inputs, labels = best_point
    return DLGResult(to_unit_images(inputs, input_range), labels.cpu().numpy().astype(np.int64), best_distance, inputs)


def _adam_step(opt: torch.optim.Optimizer, closure) -> torch.Tensor:
    distance = closure()
    opt.step()
    return distance
