"""`train.precision` (pipeline/train/precision.py): bfloat16 autocast of local training's forward + loss and of
evaluation, on both in-process executors.

A bad value is refused when params load, naming the key. Under bfloat16 the convolutions of training and of
evaluation really run in bfloat16, while weights, optimizer state and uploads stay float32 and the ledger is the
float32 run's, row for row (bytes do not depend on the precision); the accuracy after two rounds stays near
float32's. float32 itself is the reference: bench/method_fingerprint.py checks it did not move.
"""

from __future__ import annotations

from typing import Self

import pytest
import torch
from boundary import record_uploads, trainer_for
from conftest import with_section

from pipeline.config import ConfigError, parse_params
from pipeline.train import precision


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def test_a_bad_precision_is_refused_naming_the_key(default_params_raw):
    default_params_raw["train"]["precision"] = "float16"
    with pytest.raises(ConfigError, match=r"train\.precision"):
        parse_params(default_params_raw)
    default_params_raw["train"]["precision"] = "bfloat16"
    assert parse_params(default_params_raw).train.precision == "bfloat16"


def test_auto_is_bfloat16_on_a_cpu_with_amx_and_float32_elsewhere(monkeypatch):
    for amx, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(precision, "_cpu_has_amx_bf16", lambda amx=amx: amx)
        assert precision.resolved_precision("auto", "cpu") == expected
        assert precision.resolved_precision("auto", torch.device("cuda")) == "float32"  # no GPU measured yet
        for fixed in ("float32", "bfloat16"):
            assert precision.resolved_precision(fixed, "cpu") == fixed


def test_auto_sees_amx_only_where_onednn_may_use_it():
    from pipeline.machine import amx_in_use

    amx = {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert amx_in_use(amx, {}) and amx_in_use(amx, {"ONEDNN_MAX_CPU_ISA": "avx512_core_amx"})
    assert amx_in_use(amx, {"DNNL_MAX_CPU_ISA": "ALL"})
    # capped below AMX (to run an older CPU's kernels): bfloat16 would be emulated, so auto means float32
    for cap in ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"DNNL_MAX_CPU_ISA": "avx512_core_bf16"}):
        assert not amx_in_use(amx, cap)
    assert not amx_in_use(amx - {"amx_bf16"}, {})


class ConvOutputs:
    """The dtypes of every convolution's output while the block runs, by whether autograd was recording
    (training's forward) or not (evaluation). A global forward hook, so it also sees the vectorized executor's
    grouped convolutions, which are modules of their own."""

    def __init__(self) -> None:
        self.seen: dict[str, set[torch.dtype]] = {"train": set(), "eval": set()}

    def __enter__(self) -> Self:
        def hook(module, inputs, output):
            if "Conv" in type(module).__name__:
                self.seen["train" if torch.is_grad_enabled() else "eval"].add(output.dtype)

        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def _run(params, part, mnist, executor: str, precision: str, consistency: str, rounds: int):
    params = with_section(params, "train", executor=executor, precision=precision)
    trainer = trainer_for(params, part, mnist, "fedcache", f"{executor}-{consistency}-{precision}",
                          consistency=consistency)
    uploads = record_uploads(trainer)
    with ConvOutputs() as convs:
        trainer.start()
        for r in range(1, rounds + 1):
            trainer.run_round(r)
    ledger = [row[:5] for r in sorted(trainer.ledger.counts) for row in trainer.ledger.rows(r)]
    return trainer, uploads, convs.seen, ledger


def _assert_float32_outside_and_same_bytes(runs: dict) -> None:
    """runs: precision -> _run's (trainer, uploads, conv output dtypes, ledger rows)."""
    _, ref_uploads, ref_convs, ref_ledger = runs["float32"]
    bf, bf_uploads, bf_convs, bf_ledger = runs["bfloat16"]
    assert ref_convs == {"train": {torch.float32}, "eval": {torch.float32}}
    assert bf_convs == {"train": {torch.bfloat16}, "eval": {torch.bfloat16}}
    for client in bf.clients:
        assert {t.dtype for t in client.model.state_dict().values() if t.is_floating_point()} == {torch.float32}
        momentum = [s["momentum_buffer"] for s in client.optimizer.state.values()]
        assert momentum and {m.dtype for m in momentum} == {torch.float32}
    for uploads in (ref_uploads, bf_uploads):
        assert uploads and all(a.dtype == torch.float32 for arrays in uploads.values() for a in arrays.values()
                               if isinstance(a, torch.Tensor) and a.is_floating_point())
    assert bf_ledger == ref_ledger  # the same payloads, the same bytes: only the arithmetic changed
    assert any(kind == "logits" for _, _, _, kind, _ in bf_ledger)


# round: the logits a client uploads are rows recorded during its steps (the sequential executor's are checked
# below); step / live: each step's logits go through the per-step exchange (step needs the vectorized executor,
# live the sequential one)
@pytest.mark.parametrize("executor, consistency", [("vectorized", "round"), ("vectorized", "step"),
                                                   ("sequential", "live")])
def test_bfloat16_runs_the_forward_passes_in_bfloat16_and_keeps_state_uploads_and_bytes_float32(
        tiny_workspace, mnist, executor, consistency):
    _, params, part = tiny_workspace
    _assert_float32_outside_and_same_bytes(
        {precision: _run(params, part, mnist, executor, precision, consistency, rounds=1)
         for precision in ("float32", "bfloat16")})


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_bfloat16_accuracy_stays_near_float32s(tiny_workspace, mnist):
    """Two rounds of 3 local epochs at lr 0.05, so the tiny setting learns (float32 0.29-0.43 against 0.1 by
    chance). About 100 test digits in all, so one digit moves the mean about 1%: on seeds 0-4, on both
    executors, |bfloat16 - float32| was at most 0.12 (0.04 on the sequential executor). The bound is loose on
    purpose: it catches a broken bfloat16 path, not a small loss of accuracy (which the comparisons of
    real runs, with intervals, are for)."""
    _, params, part = tiny_workspace
    params = with_section(params, "train", local_epochs=3, lr=0.05)
    runs = {precision: _run(params, part, mnist, "sequential", precision, "round", rounds=2)
            for precision in ("float32", "bfloat16")}
    _assert_float32_outside_and_same_bytes(runs)
    acc = {precision: run[0].history[-1][1] for precision, run in runs.items()}
    assert abs(acc["bfloat16"] - acc["float32"]) < 0.2, acc


@pytest.mark.parametrize("amx", [True, False])
def test_auto_runs_what_it_resolves_to_and_the_run_records_it(tiny_workspace, mnist, monkeypatch, amx):
    """params.yaml's default: the same run as the precision it resolves to on this CPU, which the run records."""
    monkeypatch.setattr(precision, "_cpu_has_amx_bf16", lambda: amx)
    _, params, part = tiny_workspace
    trainer, _, convs, _ = _run(params, part, mnist, "vectorized", "auto", "step", rounds=1)
    expected = torch.bfloat16 if amx else torch.float32
    assert convs == {"train": {expected}, "eval": {expected}}
    assert trainer.environment()["precision"] == ("bfloat16" if amx else "float32")
