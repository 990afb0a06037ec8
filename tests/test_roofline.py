"""bench/roofline.py on a tiny setting: what its figures rest on, never how fast anything is.

The FLOP counter against a count by hand from ResNet-8's layer shapes, a whole round's FLOPs against the
per-sample figures times the samples the round touches, the op-class shares summing to 1, the achieved
fraction of the GEMM peak lying in (0, 1].
"""

from __future__ import annotations

import math
import threading

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench import roofline
from models.resnet import build_model


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """The digits at 14 x 14: a quarter of the convolution (the figures are checked, not learning)."""
    return small_mnist


def conv(cin: int, cout: int, k: int, out_hw: int) -> int:
    """FLOPs of a bias-free k x k convolution producing cout maps of out_hw x out_hw: 2 x multiply-accumulates."""
    return 2 * cout * out_hw * out_hw * cin * k * k


# ResNet-8 on one 1 x 28 x 28 sample, layer by layer (models/resnet.py: a 16-channel stem, one BasicBlock per
# stage at 16/32/64 channels and strides 1/2/2, 1x1 shortcuts where the shape changes, a 64 -> 10 head)
STEM = conv(1, 16, 3, 28)
RESNET8_BY_HAND = (STEM
                   + conv(16, 16, 3, 28) + conv(16, 16, 3, 28)                          # stage 1, 28 x 28
                   + conv(16, 32, 3, 14) + conv(32, 32, 3, 14) + conv(16, 32, 1, 14)    # stage 2, 14 x 14
                   + conv(32, 64, 3, 7) + conv(64, 64, 3, 7) + conv(32, 64, 1, 7)       # stage 3, 7 x 7
                   + 2 * 64 * 10)                                                       # the head


def test_the_flop_counter_agrees_with_resnet8_counted_by_hand():
    model = build_model("resnet8", 1, 10)
    assert roofline.forward_flops(model, (1, 28, 28)) == pytest.approx(RESNET8_BY_HAND, rel=0.01)
    # a training step: the forward, the weights' gradients (as much again) and the inputs' gradients (as much
    # again, but for the stem: the images need none)
    assert roofline.train_step_flops(model, (1, 28, 28), batch=8) == pytest.approx(
        3 * RESNET8_BY_HAND - STEM, rel=0.01)


def test_models_are_labelled_by_their_names_not_their_layer_counts():
    """The official code's ResNet-16 (2 blocks a stage) has 14 weighted layers; the tables name it as
    params.yaml and the official code do."""
    assert [roofline.model_label(build_model(n, 1, 10)) for n in ("resnet8", "resnet16", "resnet20")] == \
        ["ResNet-8", "ResNet-16", "ResNet-20"]
    assert roofline.model_label(torch.nn.Linear(2, 2)) == "Linear"


def test_op_classes():
    assert roofline.op_class("aten::mkldnn_convolution") == "convolution"
    assert roofline.op_class("aten::convolution_backward") == "convolution"
    assert roofline.op_class("aten::native_batch_norm_backward") == "batch norm"
    assert roofline.op_class("aten::addmm") == "linear/matmul"
    assert roofline.op_class("aten::_log_softmax") == "loss/softmax"
    assert roofline.op_class("aten::index_select") == "data movement"
    assert roofline.op_class("aten::copy_") == "data movement"
    assert roofline.op_class("aten::topk") == "other ops"  # not aten::to
    assert roofline.op_class("Optimizer.step#SGD.step") == "optimizer"


@pytest.mark.slow  # the bench's rounds on every executor, each profiled: a tool's run, the end-to-end tier
def test_a_tiny_round_on_every_executor(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    peak = roofline.gemm_peak(1, torch.float32, n=256, repeats=3)
    assert peak > 0
    for executor in roofline.EXECUTORS:
        r = roofline.measure_executor(params, part, mnist, executor, threads=1, rounds=1, warmup=0)
        work = r["work"]
        assert work.train_samples == part.num_train  # one local epoch over every client's samples
        assert work.eval_samples == sum(len(part.client_test(k)) + len(part.client_val(k))
                                        for k in range(part.num_clients))
        assert set(r["shares"]) == set(roofline.OP_CLASSES)
        assert all(s >= 0 for s in r["shares"].values())
        assert math.isclose(sum(r["shares"].values()), 1.0, rel_tol=1e-9)
        assert r["shares"]["convolution"] > 0 and r["shares"]["optimizer"] > 0
        assert 0 < roofline.achieved(r, peak) <= 1
        assert "Roofline" in roofline.markdown({"cpu": "a CPU", "date": "today", "batch": 8, "command": "python"},
                                               {(1, "fp32"): peak, (1, "bf16"): None}, {"quick": [r]}, 256)


@pytest.mark.slow  # two rounds of three groups, one profiled: the end-to-end tier
def test_the_profiled_round_runs_the_groups_in_turn_where_the_timed_ones_run_them_side_by_side(tiny_workspace,
                                                                                               mnist):
    from pipeline.train import executors

    _, params, part = tiny_workspace
    seen: set[tuple[str, bool]] = set()
    step = executors.GroupRun.step

    def watched(run, s):
        seen.add((threading.current_thread().name.split("_")[0], torch.autograd._profiler_enabled()))
        return step(run, s)

    executors.GroupRun.step = watched
    threads = torch.get_num_threads()
    try:  # hetero: three architectures, so the timed round runs them in lanes (train.side_by_side)
        r = roofline.measure_executor(params, part, mnist, "vectorized", hetero=True, threads=2, rounds=1, warmup=0)
    finally:
        executors.GroupRun.step = step
        torch.set_num_threads(threads)
    assert ("lane", False) in seen  # timed
    assert {name for name, profiled in seen if profiled} == {"MainThread"}  # profiled: in turn on one thread
    assert r["shares"]["Python/other"] > 0 and r["profiled_s"] > 0


def test_a_rounds_counted_flops_are_the_per_sample_figures_times_its_samples(tiny_workspace, mnist):
    """The whole sequential round under FlopCounterMode (training, evaluation of both splits) against
    round_work's per-sample x samples: the round visits the samples round_work says it does."""
    from workspace import fresh_trainer

    _, params, part = tiny_workspace
    trainer = fresh_trainer(roofline.executor_params(params, "sequential", 1), "fedcache", part, mnist,
                            run_name="roofline-count")
    trainer.start()
    with FlopCounterMode(display=False) as counter:
        roofline.run_round(trainer, 1)
    work = roofline.round_work(trainer.sim, 1)
    assert work.train_flops > 0 and work.eval_flops > 0
    assert counter.get_total_flops() == pytest.approx(work.total, rel=0.01)


def test_bf16_units_come_from_the_cpu_flags_and_label_an_emulated_bf16():
    assert roofline.bf16_units({"avx2", "fma"}) is None
    assert roofline.bf16_units({"avx512_bf16", "amx_bf16", "avx2"}) == "amx_bf16, avx512_bf16"
    assert roofline.precision_label("fp32", None) == "fp32"
    assert roofline.precision_label("bf16", "avx512_bf16") == "bf16"
    assert roofline.precision_label("bf16", None) == "bf16 (emulated, no bf16 units)"


def test_a_bf16_round_runs_with_the_precision_knob_and_is_set_against_the_bf16_peak(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    assert roofline.executor_params(params, "sequential", 1, "bf16").train.precision == "bfloat16"
    assert roofline.executor_params(params, "sequential", 1).train.precision == "float32"
    peaks = {(1, "fp32"): roofline.gemm_peak(1, torch.float32, n=128, repeats=2),
             (1, "bf16"): roofline.gemm_peak(1, torch.bfloat16, n=128, repeats=2)}
    r = roofline.measure_executor(params, part, mnist, "sequential", threads=1, precision="bf16", rounds=1, warmup=0,
                                  profile=False)
    assert r["precision"] == "bf16" and r["work"].total > 0 and roofline.achieved(r, peaks[(1, "bf16")]) > 0
    header = {"cpu": "a CPU", "date": "today", "batch": 8, "command": "python"}
    emulated = roofline.markdown({**header, "bf16_units": None}, peaks, {"quick": [r]}, 128)
    assert "| quick | sequential | bf16 (emulated, no bf16 units) | 1 |" in emulated
    assert "bf16 units: none" in emulated and roofline.EMULATED_ROWS in emulated
    native = roofline.markdown({**header, "bf16_units": "amx_bf16"}, peaks, {"quick": [r]}, 128)
    assert "| quick | sequential | bf16 | 1 |" in native and "emulat" not in native
    # an emulated bf16 peak from a smaller product than fp32's says so (a 4096 one does not finish in minutes)
    smaller = roofline.markdown({**header, "bf16_units": None}, peaks, {"quick": [r]}, 128, 64)
    assert "The bf16 GEMM is 64 x 64:" in smaller and "The bf16 GEMM is" not in emulated


# -- the GPU check's path (bench/gpu_check.sh: --device cuda, the torch-only harness) --

class _Event:
    """What ClassTotals reads of a torch.profiler event."""

    def __init__(self, name: str, cpu_us: float, device_us: float, on_gpu: bool = False, parent=None):
        self.name, self.cpu_parent = name, parent
        self.device_type = torch.autograd.DeviceType.CUDA if on_gpu else torch.autograd.DeviceType.CPU
        self.self_cpu_time_total, self.self_device_time_total = cpu_us, device_us


def test_on_a_gpu_the_op_classes_sum_the_kernel_time_each_op_launched_once():
    step = _Event("Optimizer.step#GroupedSGD.step", 5.0, 0.0)
    events = [_Event("aten::cudnn_convolution", 40.0, 3_000_000.0),
              _Event("aten::native_batch_norm", 30.0, 1_000_000.0),
              _Event("aten::_foreach_add_", 20.0, 500_000.0, parent=step), step,
              # the kernels' own events repeat the time their ops already hold
              _Event("sm90_xmma_fprop_implicit_gemm", 0.0, 3_000_000.0, on_gpu=True),
              _Event("batch_norm_collect_statistics_kernel", 0.0, 1_000_000.0, on_gpu=True)]
    gpu, cpu = roofline.ClassTotals(device_time=True), roofline.ClassTotals()
    gpu.add(events)
    cpu.add(events)
    assert gpu.seconds == {"convolution": 3.0, "batch norm": 1.0, "optimizer": 0.5, "other ops": 0.0}
    assert gpu.shares(10.0)["Python/other"] == pytest.approx(0.55)  # the GPU idle: the wall time no kernel ran in
    assert cpu.seconds["convolution"] == pytest.approx(40e-6) and cpu.seconds["optimizer"] == pytest.approx(25e-6)


def test_a_gpu_table_names_the_gpu_its_tf32_peak_and_its_kernel_time_profile():
    work = roofline.Work(train_samples=2000, eval_samples=400, train_flops=1.1e11, eval_flops=7e9,
                         per_model={"ResNet-8": (5.585e7, 1.869e7)})
    shares = dict.fromkeys(roofline.OP_CLASSES, 1 / len(roofline.OP_CLASSES))
    r = {"executor": "vectorized", "precision": "bf16", "threads": 1, "train_s": 0.5, "eval_s": 0.1, "round_s": 0.6,
         "work": work, "clients": 20, "profiled_s": 0.9, "shares": shares}
    header = {"cpu": "NVIDIA H100 (CUDA; host: a CPU)", "date": "today", "batch": 8, "command": "python",
              "bf16_units": "tensor cores", "gpu": True}
    peaks = {(1, "fp32"): 5e13, (1, "bf16"): 8e14}
    table = roofline.markdown(header, peaks, {"paper": [r]}, 8192)
    assert table.startswith("# Roofline: FedCache rounds against the GPU's peak (NVIDIA H100")
    assert roofline.GPU_PEAK in table and roofline.GPU_PROFILE in table and roofline.CPU_PROFILE not in table
    assert "| paper: the paper's: K=300 over all 60,000 FashionMNIST samples, ResNet-20 on every client | 20 |" in table
    assert "| paper | vectorized | bf16 | 1 | 0.50 | 0.10 | 0.60 | 195.00 | 800000.0 | 0.0% |" in table
    cpu_table = roofline.markdown({**header, "gpu": False, "cpu": "a CPU"}, peaks, {"quick": [r]}, 4096)
    assert "against the CPU's peak" in cpu_table and roofline.CPU_PROFILE in cpu_table
    assert roofline.GPU_PEAK not in cpu_table


@pytest.mark.parametrize("argv, says", [(["--settings", "paper"], "setting paper: needs --harness"),
                                         (["--harness", "--settings", "default"],
                                          "setting default: with --harness (or a GPU) choose from demo, paper")])
def test_settings_that_need_the_other_path_are_refused_before_any_work(monkeypatch, capsys, argv, says):
    monkeypatch.setattr("sys.argv", ["roofline.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        roofline.main()
    assert exit_.value.code == 2 and says in capsys.readouterr().err
