"""G client models of one architecture run as ONE network of grouped convolutions.

A vectorized executor trains G federated clients in one batched step with this: every client
keeps its own weights, BatchNorm statistics and SGD momentum, stacked along a leading client
dimension, and the result is numerically the same (up to float rounding) as training each
model on its own with torch.optim.SGD.

Layouts
  rows      what callers see: client a's B rows are x[a*B:(a+1)*B] (A*B rows for the A active
            clients, always the prefix 0..A-1 of the G). A bool mask [A, B] marks real rows;
            the others are padding and never touch a real row's result or any statistic.
  internal  inside the network: [B, A*C, H, W], client a's channels are the block
            a*C:(a+1)*C, so a convolution with groups=A (times its own groups) keeps the
            clients apart and a per-channel BatchNorm is automatically per client. After
            pooling, the flat internal layout is [B, A*C].

Only the leaf layers that mix channels or hold state (Conv2d, BatchNorm2d, Linear) are
replaced by grouped versions; the models' own `forward` code runs unchanged on the internal
layout, which is why only containers whose forward is known to be channel-wise (ReLU,
residual adds, global average pooling) are accepted (see `supports`).

Storage: conv weight [G*out, in/groups, k, k], linear weight [G, out, in] and bias [G, out],
BatchNorm affine/running stats [G*C], num_batches_tracked [G]. Every tensor is client-major,
so `t.view(G, -1)[i]` is client i's tensor flattened, and the active clients use the prefix
slice: inactive clients cost nothing and cannot change.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.multiexit import Block, BottleneckExit, FinalExit, MultiExitResNet
from models.resnet import BasicBlock, ResNet

# NCHW unless a caller asks: the vectorized executor trains in NHWC, where it measured faster, and evaluates in
# NCHW, where NHWC measured slower (pipeline/train/executors.py, TRAIN_CHANNELS_LAST).
DEFAULT_CHANNELS_LAST = False

# Modules whose forward only applies channel-wise operations (or calls children), so it runs
# unchanged on the internal layout. Exact types: a subclass may override forward.
_LAYOUT_SAFE = (ResNet, BasicBlock, MultiExitResNet, Block, BottleneckExit, FinalExit,
                nn.Sequential, nn.ModuleList, nn.ReLU, nn.Identity)
_ROOTS = (ResNet, MultiExitResNet)


@dataclass
class _Step:
    """The current step's shape, shared by the wrapper and every grouped BatchNorm."""

    active: int = 0
    batch: int = 0
    mask: torch.Tensor | None = None


def client_view(t: torch.Tensor, num_clients: int) -> torch.Tensor:
    """[G, n]: row i is client i's part of a stacked tensor (a view: writes go through)."""
    return t.view(num_clients, -1)


# -- layout conversions -------------------------------------------------------------------


def _rows_to_maps(x: torch.Tensor, A: int, B: int, channels_last: bool) -> torch.Tensor:
    """[A*B, C, H, W] rows -> [B, A*C, H, W] internal."""
    _, c, h, w = x.shape
    x = x.reshape(A, B, c, h, w)
    if channels_last:
        # [B, H, W, A, C] in memory is exactly the NHWC storage of [B, A*C, H, W]: one copy. With one channel a
        # client the reshape is a view instead, whose strides are not NHWC, and every convolution after it would
        # run NCHW: copied then. Not by .contiguous(channels_last): with one channel in all (one client) it keeps
        # the NCHW strides, which count as NHWC too, and the convolutions still pick NCHW.
        maps = x.permute(1, 3, 4, 0, 2).reshape(B, h, w, A * c).permute(0, 3, 1, 2)
        if maps.stride(1) != 1:
            maps = torch.empty_like(maps, memory_format=torch.channels_last).copy_(maps)
        return maps
    return x.transpose(0, 1).reshape(B, A * c, h, w)


def _rows_to_flat(x: torch.Tensor, A: int, B: int) -> torch.Tensor:
    """[A*B, D] rows -> [B, A*D] flat internal."""
    return x.reshape(A, B, -1).transpose(0, 1).reshape(B, -1)


def _flat_to_rows(x: torch.Tensor, A: int, B: int) -> torch.Tensor:
    """[B, A*D] flat internal -> [A*B, D] rows."""
    return x.reshape(B, A, -1).transpose(0, 1).reshape(A * B, -1)


# -- grouped leaf layers ------------------------------------------------------------------


def _prefix(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first n entries of a stacked parameter; the tensor itself when all clients are active,
    which spares autograd the slice's backward (a zero-filled full-size copy of the gradient)."""
    return t if n == t.shape[0] else t[:n]



class _GroupedLeaf(nn.Module):
    """A grouped layer: its parameters are stacked over G clients, each with a momentum buffer.

    The momentum buffer of parameter `p` is the non-persistent buffer `p_momentum`: it moves
    with `.to()` but is not part of the layer's state (GroupedSGD reads and writes it)."""

    def _add_parameter(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> None:
        self.register_parameter(name, nn.Parameter(like.new_empty(shape)))
        self.register_buffer(name + "_momentum", like.new_zeros(shape), persistent=False)


class GroupedConv2d(_GroupedLeaf):
    def __init__(self, conv: nn.Conv2d, num_clients: int):
        super().__init__()
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.stride, self.padding, self.dilation, self.groups = conv.stride, conv.padding, conv.dilation, conv.groups
        G = num_clients
        self._add_parameter("weight", (G * conv.weight.shape[0], *conv.weight.shape[1:]), conv.weight)
        if conv.bias is not None:
            self._add_parameter("bias", (G * conv.out_channels,), conv.bias)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        A = x.shape[1] // self.in_channels
        n = A * self.out_channels
        bias = None if self.bias is None else _prefix(self.bias, n)
        return F.conv2d(x, _prefix(self.weight, n), bias, self.stride, self.padding, self.dilation, self.groups * A)


class GroupedLinear(_GroupedLeaf):
    """Takes and returns the flat internal layout [B, A*in] -> [B, A*out]."""

    def __init__(self, linear: nn.Linear, num_clients: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._add_parameter("weight", (num_clients, *linear.weight.shape), linear.weight)
        if linear.bias is not None:
            self._add_parameter("bias", (num_clients, linear.out_features), linear.bias)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, A = x.shape[0], x.shape[1] // self.in_features
        per_client = x.reshape(B, A, self.in_features).transpose(0, 1)  # [A, B, in]
        weight_t = _prefix(self.weight, A).transpose(1, 2)
        if self.bias is None:
            out = torch.bmm(per_client, weight_t)
        else:
            out = torch.baddbmm(_prefix(self.bias, A).unsqueeze(1), per_client, weight_t)
        return out.transpose(0, 1).reshape(B, A * self.out_features)


class GroupedBatchNorm2d(_GroupedLeaf):
    """Per-client BatchNorm over each client's real rows only (see `_masked_train`)."""

    def __init__(self, bn: nn.BatchNorm2d, num_clients: int, step: _Step):
        super().__init__()
        self.num_features, self.eps, self.momentum = bn.num_features, bn.eps, bn.momentum
        self.step = step
        G, C = num_clients, bn.num_features
        self._add_parameter("weight", (G * C,), bn.weight)
        self._add_parameter("bias", (G * C,), bn.bias)
        self.register_buffer("running_mean", bn.running_mean.new_zeros(G * C))
        self.register_buffer("running_var", bn.running_var.new_ones(G * C))
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked.new_zeros(G))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        A = x.shape[1] // self.num_features
        n = A * self.num_features
        mean, var = self.running_mean[:n], self.running_var[:n]
        weight, bias = _prefix(self.weight, n), _prefix(self.bias, n)
        if not self.training:
            return F.batch_norm(x, mean, var, weight, bias, False, 0.0, self.eps)
        mask = self.step.mask
        if mask is None:
            # every channel belongs to one client, so the plain batch statistics are per client;
            # F.batch_norm updates the prefix views of the running stats in place
            self.num_batches_tracked[:A] += 1
            return F.batch_norm(x, mean, var, weight, bias, True, self.momentum, self.eps)
        return self._masked_train(x, A, mask, weight, bias)

    def _masked_train(self, x: torch.Tensor, A: int, mask: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor) -> torch.Tensor:
        B, _, H, W = x.shape
        C = self.num_features
        xs = x.unflatten(1, (A, C))  # [B, A, C, H, W]
        weights = mask.t().to(x.dtype)[:, :, None]  # [B, A, 1]: 1 = real row
        rows = mask.sum(1)
        # clamped so a client without real rows gives 0/1, not NaN (its stats are not kept)
        count = (rows.clamp(min=1) * (H * W)).to(x.dtype)[:, None]  # [A, 1]
        # sum over the image first, then weigh the rows: one pass over the maps per statistic
        mean = (xs.sum((3, 4)) * weights).sum(0) / count  # [A, C]
        centred = xs - mean[None, :, :, None, None]
        var = (centred.square().sum((3, 4)) * weights).sum(0) / count  # biased, as torch normalises
        self._update_running_stats(A, rows > 0, mean.detach(), var.detach(), count)
        scale = torch.rsqrt(var + self.eps) * weight.view(A, C)
        y = centred * scale[None, :, :, None, None] + bias.view(A, C)[None, :, :, None, None]
        return y.flatten(1, 2)

    @torch.no_grad()
    def _update_running_stats(self, A: int, real: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                              count: torch.Tensor) -> None:
        """As torch: exponential average with the unbiased variance; only clients with real rows."""
        C, m = self.num_features, self.momentum
        unbiased = var * count / (count - 1).clamp(min=1)  # n = 1 would be an error in torch
        running_mean = self.running_mean[: A * C].view(A, C)
        running_var = self.running_var[: A * C].view(A, C)
        keep = real[:, None]
        running_mean.copy_(torch.where(keep, (1 - m) * running_mean + m * mean, running_mean))
        running_var.copy_(torch.where(keep, (1 - m) * running_var + m * unbiased, running_var))
        self.num_batches_tracked[:A] += real.to(self.num_batches_tracked.dtype)


class _RowsModule(nn.Module):
    """Runs a grouped sub-network on rows: rows in, rows out (for the FedProto adapter)."""

    def __init__(self, inner: nn.Module, step: _Step):
        super().__init__()
        self.inner = inner
        self.step = step

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        A, B = self.step.active, self.step.batch
        return _flat_to_rows(self.inner(_rows_to_flat(f, A, B)), A, B)


# -- which models can be grouped ----------------------------------------------------------


def _leaf_problem(module: nn.Module) -> str | None:
    if isinstance(module, nn.Conv2d) and module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r}"
    if isinstance(module, nn.BatchNorm2d):
        if not (module.affine and module.track_running_stats):
            return "BatchNorm without affine parameters or running statistics"
        if module.momentum is None:
            return "BatchNorm with a cumulative average (momentum=None)"
    return None


def supports(model: nn.Module) -> str | None:
    """None if `model` can be grouped, else a short reason why not."""
    if type(model) not in _ROOTS:
        return f"unsupported model type {type(model).__name__}"
    for name, module in model.named_modules():
        where = name or "model"
        if type(module) in (nn.Conv2d, nn.BatchNorm2d, nn.Linear):
            problem = _leaf_problem(module)
            if problem:
                return f"{where}: {problem}"
        elif type(module) not in _LAYOUT_SAFE:
            return f"{where}: unsupported layer type {type(module).__name__}"
    return None


def _signature(model: nn.Module) -> list[tuple]:
    """What two models must share to be grouped: module tree, types and layer settings."""
    return [(name, type(m), m.extra_repr()) for name, m in model.named_modules()]


def _build_grouped_net(template: nn.Module, num_clients: int, step: _Step) -> nn.Module:
    """A copy of `template` with its Conv2d/BatchNorm2d/Linear replaced by (empty) grouped layers."""
    grouped: dict[int, nn.Module] = {}
    for module in template.modules():
        if type(module) is nn.Conv2d:
            grouped[id(module)] = GroupedConv2d(module, num_clients)
        elif type(module) is nn.BatchNorm2d:
            grouped[id(module)] = GroupedBatchNorm2d(module, num_clients, step)
        elif type(module) is nn.Linear:
            grouped[id(module)] = GroupedLinear(module, num_clients)
    # deepcopy's memo substitutes the grouped layers wherever the originals sit (shared ones too)
    return copy.deepcopy(template, memo=dict(grouped))


# -- the wrapper --------------------------------------------------------------------------


class GroupedModel(nn.Module):
    """G models of one architecture as one network; inputs and outputs in rows layout.

    Call `set_step(active, batch, mask)` before the forward calls of a step. The parameters,
    buffers and momentum are copies: `load_from` / `write_back` move them to and from models."""

    def __init__(self, models: list[nn.Module], channels_last: bool = DEFAULT_CHANNELS_LAST):
        super().__init__()
        if not models:
            raise ValueError("GroupedModel needs at least one model")
        template = models[0]
        reason = supports(template)
        if reason:
            raise ValueError(f"cannot group this model: {reason}")
        self._template_signature = _signature(template)
        self.num_clients = len(models)
        self.channels_last = channels_last
        self._step = _Step()
        self.net = _build_grouped_net(template, self.num_clients, self._step)
        if hasattr(template, "adapter"):
            self.adapter = _RowsModule(self.net.adapter, self._step)
        self._param_names = [name for name, _ in template.named_parameters()]
        self._buffer_names = [name for name, _ in template.named_buffers()]
        self.load_from(models)
        self.train(template.training)

    # -- the step --

    def set_step(self, active: int, batch: int, mask: torch.Tensor | None) -> None:
        if not 1 <= active <= self.num_clients:
            raise ValueError(f"active must be in 1..{self.num_clients}, got {active}")
        if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (active, batch)):
            raise ValueError(f"mask must be a bool tensor of shape ({active}, {batch}), "
                             f"got {mask.dtype} {tuple(mask.shape)}")
        self._step.active, self._step.batch, self._step.mask = active, batch, mask

    def _maps(self, x: torch.Tensor) -> torch.Tensor:
        A, B = self._step.active, self._step.batch
        if x.shape[0] != A * B:
            raise ValueError(f"expected {A}x{B} = {A * B} rows (set_step), got {x.shape[0]}")
        return _rows_to_maps(x, A, B, self.channels_last)

    def _rows(self, flat: torch.Tensor) -> torch.Tensor:
        return _flat_to_rows(flat, self._step.active, self._step.batch)

    # -- the models' methods, in rows layout --

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(self.net(self._maps(x)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(self.net.features(self._maps(x)))

    def head(self, f: torch.Tensor) -> torch.Tensor:
        return self._rows(self.net.head(_rows_to_flat(f, self._step.active, self._step.batch)))

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self._rows(out) for out in self.net.forward_all(self._maps(x))]

    # -- state --

    def named_grouped_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """(name, stacked parameter), the names being the template's named_parameters() names."""
        return self.net.named_parameters()

    def momentum_buffer(self, name: str) -> torch.Tensor:
        """The stacked SGD momentum of parameter `name` (zeros = no momentum yet)."""
        return self.net.get_buffer(name + "_momentum")

    def _check_models(self, models: list[nn.Module], at_least: int) -> None:
        if len(models) < at_least:
            raise ValueError(f"expected {at_least} models, got {len(models)}")
        for i, model in enumerate(models[:at_least]):
            if _signature(model) != self._template_signature:
                raise ValueError(f"model {i} differs in architecture from the grouped template")

    @torch.no_grad()
    def load_from(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None = None) -> None:
        """Copy the G models' parameters, buffers and (if given) SGD momentum into the stacks."""
        G = self.num_clients
        if len(models) != G:
            raise ValueError(f"expected exactly {G} models, got {len(models)}")
        self._check_models(models, G)
        for i, model in enumerate(models):
            params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
            for name in self._param_names:
                client_view(self.net.get_parameter(name), G)[i].copy_(params[name].reshape(-1))
            for name in self._buffer_names:
                client_view(self.net.get_buffer(name), G)[i].copy_(buffers[name].reshape(-1))
            if optimizers is not None:
                state = optimizers[i].state
                for name in self._param_names:
                    buf = state.get(params[name], {}).get("momentum_buffer")
                    target = client_view(self.momentum_buffer(name), G)[i]
                    if buf is None:
                        target.zero_()
                    else:
                        target.copy_(buf.reshape(-1))

    @torch.no_grad()
    def write_back(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer] | None = None,
                   count: int | None = None) -> None:
        """Copy client i's slice into models[i] (and its momentum into optimizers[i]), i < count.

        A parameter that had no momentum buffer and still has none (all zeros) gets none, so the
        optimizer's state stays what torch would have (e.g. for parameters never trained)."""
        G = self.num_clients
        count = G if count is None else count
        self._check_models(models, count)
        for i in range(count):
            params, buffers = dict(models[i].named_parameters()), dict(models[i].named_buffers())
            for name in self._param_names:
                params[name].copy_(client_view(self.net.get_parameter(name), G)[i].view_as(params[name]))
            for name in self._buffer_names:
                buffers[name].copy_(client_view(self.net.get_buffer(name), G)[i].view_as(buffers[name]))
            if optimizers is not None:
                for name in self._param_names:
                    p = params[name]
                    momentum = client_view(self.momentum_buffer(name), G)[i].view_as(p)
                    state = optimizers[i].state
                    current = state.get(p, {}).get("momentum_buffer")
                    if current is not None:
                        current.copy_(momentum)
                    elif bool(momentum.any()):
                        state[p]["momentum_buffer"] = momentum.clone()
                    # else: never stepped; leave the state as torch would have it (no buffer)


class GroupedSGD:
    """torch.optim.SGD (dampening 0, no Nesterov) applied to each active client's own slice."""

    def __init__(self, model: GroupedModel, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.model = model
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def zero_grad(self) -> None:
        for _, p in self.model.named_grouped_parameters():
            p.grad = None

    @torch.no_grad()
    def step(self, active: int, trainable: Callable[[str], bool] | None = None) -> None:
        """Update the first `active` clients' parameters that pass `trainable` (None = all).

        As torch, a parameter without a gradient is skipped. A zero momentum buffer stands for
        "no buffer yet": momentum * 0 + d = d is exactly torch's first step."""
        G = self.model.num_clients
        for name, p in self.model.named_grouped_parameters():
            if p.grad is None or (trainable is not None and not trainable(name)):
                continue
            weight = client_view(p, G)[:active]
            d = p.grad.reshape(G, -1)[:active]
            if self.weight_decay:
                d = d.add(weight, alpha=self.weight_decay)
            if self.momentum:
                buf = client_view(self.model.momentum_buffer(name), G)[:active]
                d = buf.mul_(self.momentum).add_(d)
            weight.add_(d, alpha=-self.lr)
