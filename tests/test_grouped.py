"""Grouped network: G client models trained as one must equal each trained on its own.

The reference trains every client separately with its own torch.optim.SGD; the grouped run
does the same steps through GroupedModel + GroupedSGD in the executor's way (rows layout,
padding masked out of a per-client mean loss, clients sorted so the active ones are a prefix).

Everything runs in float64: in float32 the two sum in different orders, and how far the results
drift apart after a few momentum steps depends on the CPU and its BLAS (a 1e-4 tolerance held on
one CPU and not on another).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import layout, unit_tier_first
from models.multiexit import MultiExitResNet
from models.resnet import build_model
from models.grouped import GroupedModel, GroupedSGD, client_view, supports

LR, MOMENTUM, WEIGHT_DECAY = 0.01, 0.9, 5e-4
BATCH = 8
CLASSES = 10
TOL = {"rtol": 1e-7, "atol": 1e-9}


@pytest.fixture(autouse=True)
def _float64():
    """Models and data of every test here in float64 (see the module's docstring)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# -- the client models and their losses ---------------------------------------------------


def _with_adapter(model: nn.Module) -> nn.Module:
    model.adapter = nn.Sequential(nn.Linear(model.feature_dim, 32), nn.ReLU(), nn.Linear(32, 8))
    return model


KINDS = {  # kind -> (model factory, input shape)
    "resnet8": (lambda: build_model("resnet8", 1, CLASSES), (1, 28, 28)),
    "resnet16": (lambda: build_model("resnet16", 3, CLASSES), (3, 32, 32)),
    "multiexit": (lambda: MultiExitResNet(1, CLASSES, blocks_per_stage=1, exit_width=16), (1, 28, 28)),
    "adapter": (lambda: _with_adapter(build_model("resnet8", 3, CLASSES)), (3, 32, 32)),
}
PROTOTYPES = torch.randn(CLASSES, 8, generator=torch.Generator().manual_seed(7))


def row_loss(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-row loss; the same code serves a model and the GroupedModel (same method names)."""
    if kind == "multiexit":
        return sum(F.cross_entropy(out, y, reduction="none") for out in model.forward_all(x))
    if kind == "adapter":
        f = model.features(x)
        pull = (model.adapter(f) - PROTOTYPES[y]).square().mean(1)
        return F.cross_entropy(model.head(f), y, reduction="none") + pull
    return F.cross_entropy(model(x), y, reduction="none")


def outputs(kind: str, model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    if kind == "multiexit":
        return model.forward_all(x)
    f = model.features(x)
    extra = [model.adapter(f)] if kind == "adapter" else []
    return [model(x), f, model.head(f), *extra]


def make_clients(kind: str, G: int, seed: int = 0) -> tuple[list[nn.Module], list[torch.optim.SGD]]:
    """G independently initialised models with their SGDs; odd clients already hold momentum."""
    factory, shape = KINDS[kind]
    torch.manual_seed(seed)
    models = [factory() for _ in range(G)]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY) for m in models]
    for i in range(1, G, 2):
        x, y = torch.randn(4, *shape), torch.randint(0, CLASSES, (4,))
        opts[i].zero_grad()
        row_loss(kind, models[i], x, y).mean().backward()
        opts[i].step()
    return models, opts


def make_data(kind: str, sizes: list[int], seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shape = KINDS[kind][1]
    return [(torch.randn(n, *shape, generator=g), torch.randint(0, CLASSES, (n,), generator=g)) for n in sizes]


# -- the two ways of training -------------------------------------------------------------


def train_separately(kind, models, opts, data, trainable=None) -> None:
    for model, opt, (x, y) in zip(models, opts, data):
        model.train()
        for start in range(0, len(y), BATCH):
            opt.zero_grad()
            row_loss(kind, model, x[start:start + BATCH], y[start:start + BATCH]).mean().backward()
            if trainable is not None:  # torch skips a parameter without a gradient
                for name, p in model.named_parameters():
                    if not trainable(name):
                        p.grad = None
            opt.step()


def grouped_batch(data, step: int, active: int, pad_seed: int = 2):
    """Step `step`'s rows of the first `active` clients, padded to the longest with garbage."""
    parts = [(x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]) for x, y in data[:active]]
    B = max(len(y) for _, y in parts)
    g = torch.Generator().manual_seed(pad_seed + step)
    xs, ys, mask = [], [], torch.zeros(active, B, dtype=torch.bool)
    for a, (x, y) in enumerate(parts):
        pad = B - len(y)
        xs.append(torch.cat([x, 100 * torch.randn(pad, *x.shape[1:], generator=g)]))  # must not leak
        ys.append(torch.cat([y, torch.zeros(pad, dtype=y.dtype)]))
        mask[a, :len(y)] = True
    return torch.cat(xs), torch.cat(ys), B, (None if bool(mask.all()) else mask)


def train_grouped(kind, grouped: GroupedModel, opt: GroupedSGD, data, trainable=None) -> None:
    """The executor's step: per-row loss -> per-client masked mean -> summed -> one backward."""
    steps = [math.ceil(len(y) / BATCH) for _, y in data]
    assert steps == sorted(steps, reverse=True), "clients must be sorted so the active ones are a prefix"
    grouped.train()
    for step in range(steps[0]):
        active = sum(s > step for s in steps)
        x, y, B, mask = grouped_batch(data, step, active)
        grouped.set_step(active, B, mask)
        real = torch.ones(active, B) if mask is None else mask.float()
        per_client = (row_loss(kind, grouped, x, y).view(active, B) * real).sum(1) / real.sum(1)
        opt.zero_grad()
        per_client.sum().backward()
        opt.step(active, trainable)


def assert_clients_equal(models_a, opts_a, models_b, opts_b) -> None:
    for i, (ma, oa, mb, ob) in enumerate(zip(models_a, opts_a, models_b, opts_b)):
        for (name, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
            torch.testing.assert_close(pb, pa, **TOL, msg=lambda m: f"client {i} {name}: {m}")
            buf_a = oa.state.get(pa, {}).get("momentum_buffer")
            buf_b = ob.state.get(pb, {}).get("momentum_buffer")
            assert (buf_a is None) == (buf_b is None), f"client {i} {name}: momentum presence differs"
            if buf_a is not None:
                torch.testing.assert_close(buf_b, buf_a, **TOL, msg=lambda m: f"client {i} {name} momentum: {m}")
        for (name, ba), (_, bb) in zip(ma.named_buffers(), mb.named_buffers()):
            torch.testing.assert_close(bb, ba, **TOL, msg=lambda m: f"client {i} {name}: {m}")


def run_both(kind: str, models, opts, sizes: list[int], channels_last: bool = False, trainable=None):
    ref_models, ref_opts = copy.deepcopy((models, opts))  # one deepcopy keeps each opt on its model
    data = make_data(kind, sizes)
    train_separately(kind, ref_models, ref_opts, data, trainable)
    grouped = GroupedModel(models, channels_last=channels_last)
    grouped.load_from(models, opts)
    train_grouped(kind, grouped, GroupedSGD(grouped, LR, MOMENTUM, WEIGHT_DECAY), data, trainable)
    grouped.write_back(models, opts)
    return grouped, (models, opts), (ref_models, ref_opts)


# -- tests --------------------------------------------------------------------------------

# sizes: steps 3/2/2/1 with BATCH 8; the first step is unmasked (mask None), later ones have
# a last partial batch and clients that dropped out
CASES = [("resnet8", [21, 16, 12, 8], False), ("resnet8", [21, 16, 12, 8], True),
         ("resnet16", [21, 12, 8], False), ("multiexit", [21, 12, 8], False), ("adapter", [21, 12, 8], False)]


# ResNet-8 in both layouts in the unit tier; the other architectures repeat the check (make test)
@pytest.mark.parametrize("kind, sizes, channels_last", unit_tier_first(CASES, keep=2))
def test_grouped_training_equals_separate_training(kind, sizes, channels_last):
    models, opts = make_clients(kind, len(sizes))
    grouped, (models, opts), (ref_models, ref_opts) = run_both(kind, models, opts, sizes, channels_last)
    assert_clients_equal(ref_models, ref_opts, models, opts)

    # eval mode (running statistics): the same outputs for every client
    G, n = len(sizes), 5
    x = torch.randn(G * n, *KINDS[kind][1])
    grouped.eval()
    grouped.set_step(G, n, None)
    got = outputs(kind, grouped, x)
    for i, ref in enumerate(ref_models):
        want = outputs(kind, ref.eval(), x[i * n:(i + 1) * n])
        for g_out, r_out in zip(got, want):
            torch.testing.assert_close(g_out[i * n:(i + 1) * n], r_out, **TOL)


def test_trainable_predicate_leaves_the_other_parameters_and_momentum_alone():
    def head_only(name: str) -> bool:
        return name.startswith("head.")

    models, opts = make_clients("resnet8", 3)
    before = copy.deepcopy(models)
    _, (models, opts), (ref_models, ref_opts) = run_both("resnet8", models, opts, [21, 12, 8], trainable=head_only)
    assert_clients_equal(ref_models, ref_opts, models, opts)
    for i, (old, new) in enumerate(zip(before, models)):
        for (name, p_old), (_, p_new) in zip(old.named_parameters(), new.named_parameters()):
            if not head_only(name):
                assert torch.equal(p_old, p_new), f"client {i} {name} changed"
                # client 1 holds momentum from its warm-up step, clients 0 and 2 have none
                assert ("momentum_buffer" in opts[i].state.get(p_new, {})) == (i == 1)


def _stacked_state(grouped: GroupedModel) -> dict[str, torch.Tensor]:
    state = {n: t.detach().clone() for n, t in grouped.net.state_dict().items()}
    for name, _ in grouped.named_grouped_parameters():
        state[name + "_momentum"] = grouped.momentum_buffer(name).clone()
    return state


@pytest.mark.parametrize("masked", [False, True])
def test_inactive_clients_do_not_change(masked):
    models, opts = make_clients("resnet8", 4)
    grouped = GroupedModel(models)
    grouped.load_from(models, opts)
    opt = GroupedSGD(grouped, LR, MOMENTUM, WEIGHT_DECAY)
    before = _stacked_state(grouped)
    A, B = 2, 4
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]]) if masked else None
    grouped.train()
    grouped.set_step(A, B, mask)
    F.cross_entropy(grouped(torch.randn(A * B, 1, 28, 28)), torch.randint(0, CLASSES, (A * B,))).backward()
    opt.step(A)
    after = _stacked_state(grouped)
    changed = 0
    for name, old in before.items():
        old_c, new_c = client_view(old, 4), client_view(after[name], 4)
        assert torch.equal(old_c[A:], new_c[A:]), f"{name}: an inactive client changed"
        changed += not torch.equal(old_c[:A], new_c[:A])
    assert changed > len(before) / 2  # the active clients did train

    # write_back(count=A) touches only the active clients' models
    untouched = copy.deepcopy(models[A:])
    grouped.write_back(models, opts, count=A)
    for old, new in zip(untouched, models[A:]):
        for t_old, t_new in zip(old.state_dict().values(), new.state_dict().values()):
            assert torch.equal(t_old, t_new)


def test_padding_rows_do_not_influence_real_rows_or_statistics():
    models, _ = make_clients("resnet8", 2)
    x = torch.randn(2 * 6, 1, 28, 28)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 5 + [False]])
    results = []
    for scale in (0.0, 1e3):
        grouped = GroupedModel(models).train()
        noisy = x.clone()
        noisy.view(2, 6, -1)[~mask] = scale * torch.randn(3, 28 * 28)
        grouped.set_step(2, 6, mask)
        logits = grouped(noisy)
        assert torch.isfinite(logits).all()
        results.append((logits.view(2, 6, -1)[mask], grouped.net.state_dict()))
    torch.testing.assert_close(results[0][0], results[1][0])
    for name, t in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], t)


def test_names_shapes_and_copies():
    models, _ = make_clients("adapter", 3)
    grouped = GroupedModel(models)
    names = [n for n, _ in grouped.named_grouped_parameters()]
    assert names == [n for n, _ in models[0].named_parameters()]
    params = dict(grouped.named_grouped_parameters())
    assert params["stages.0.0.conv1.weight"].shape == (3 * 16, 16, 3, 3)
    assert params["head.weight"].shape == (3, CLASSES, 64) and params["head.bias"].shape == (3, CLASSES)
    assert params["adapter.0.weight"].shape == (3, 32, 64)
    assert grouped.net.get_buffer("stem.1.num_batches_tracked").shape == (3,)
    # copies, not shared storage
    with torch.no_grad():
        params["head.bias"].add_(1.0)
    assert not torch.equal(client_view(params["head.bias"], 3)[0], models[0].head.bias)
    multi = GroupedModel([MultiExitResNet(1, CLASSES, blocks_per_stage=1) for _ in range(2)])
    assert "blocks.0.exit.fc.bias" in dict(multi.named_grouped_parameters())


def test_supports_and_refusals():
    assert supports(build_model("resnet8", 1, CLASSES)) is None
    assert supports(MultiExitResNet(1, CLASSES)) is None
    with_dropout = build_model("resnet8", 1, CLASSES)
    with_dropout.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(64, CLASSES))
    assert "Dropout" in supports(with_dropout)
    cumulative = build_model("resnet8", 1, CLASSES)
    cumulative.stem[1].momentum = None
    assert "momentum=None" in supports(cumulative)
    assert "Sequential" in supports(nn.Sequential(nn.Conv2d(1, 4, 3)))
    with pytest.raises(ValueError, match="architecture"):
        GroupedModel([build_model("resnet8", 1, CLASSES), build_model("resnet16", 1, CLASSES)])
    with pytest.raises(ValueError, match="Dropout"):
        GroupedModel([with_dropout])
    grouped = GroupedModel([build_model("resnet8", 1, CLASSES) for _ in range(2)])
    grouped.set_step(2, 3, None)
    with pytest.raises(ValueError, match="rows"):
        grouped(torch.randn(5, 1, 28, 28))
    with pytest.raises(ValueError, match="mask"):
        grouped.set_step(2, 3, torch.ones(2, 4, dtype=torch.bool))


def _conv_input_layouts(grouped: GroupedModel, x: torch.Tensor) -> set[str]:
    """The memory layout of every convolution's input during one forward ("NHWC", "NCHW" or "other")."""
    seen: set[str] = set()

    def hook(module, inputs):
        if "Conv" in type(module).__name__:
            t = inputs[0]
            seen.add(layout(t))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        grouped(x)
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize("kind", ["resnet8", "resnet16"])  # one channel a client, three
@pytest.mark.parametrize("active", [3, 1])  # one active client: one channel in all, for resnet8
@pytest.mark.parametrize("channels_last", [True, False])
def test_channels_last_reaches_every_convolution_whatever_the_channels(kind, active, channels_last):
    """With one channel a client the rows-to-maps reshape is a view that is not NHWC, and with one channel in all
    NCHW strides count as NHWC: the switch must still give every convolution NHWC input (else they silently run
    NCHW), and without it none runs NHWC."""
    models, _ = make_clients(kind, 3)
    grouped = GroupedModel(models, channels_last=channels_last).train()
    grouped.set_step(active, 4, None)
    layouts = _conv_input_layouts(grouped, torch.randn(active * 4, *KINDS[kind][1]))
    if channels_last:
        assert layouts == {"NHWC"}
    else:
        assert "NHWC" not in layouts
