"""Speed measured against the machine's limit: a FedCache round's FLOPs, the CPU's peak, the achieved fraction.

    .venv/bin/python bench/roofline.py                                  # default and demo, both executors (idle machine)
    .venv/bin/python bench/roofline.py --settings default --threads 2   # every executor on 2 torch threads
    .venv/bin/python bench/roofline.py --quick                          # a small setting: a smoke test, minutes
    python3 bench/roofline.py --device cuda --executors vectorized      # a GPU: demo and paper (bench/gpu_check.sh)

For each setting (`default`: params.yaml, K = 20 clients x 100 FashionMNIST samples, ResNet-8; `demo`: the
official FedCache code's demo, K = 20 over all 60,000 samples with A1/A2/A3 = ResNet-8/16/20 by client index,
bench/fedcache_consistency.py's OFFICIAL_DEMO) and each executor it builds a fresh Trainer (bench/workspace.py:
the partition, encode and index stages run in bench/.work/roofline/<setting>/) and reports:

  work      a round's FLOPs: the forward+backward FLOPs of one training step of each client's model per
            sample (torch.utils.flop_counter.FlopCounterMode; it counts convolutions and matrix products,
            not BatchNorm, activations or the optimizer) times the samples the round trains on (local epochs x
            training samples), plus one forward per evaluated sample (each client's test and validation split,
            as the training stage evaluates every round). The vectorized executor also computes padding rows
            for partial batches; those are not useful work and are not counted.
  peak      a large square GEMM (torch.mm) on the same torch threads as the executor, best of a few repeats,
            in fp32 and in bf16. A CPU without bf16 units (/proc/cpuinfo: neither avx512_bf16 nor amx_bf16)
            emulates the bf16 GEMM: its figure is measured all the same and marked "emulated, no bf16 units".
  achieved  round FLOPs / round wall seconds (training + evaluation; no results or checkpoint writes) / peak,
            per executor and precision: fp32 is `train.precision: float32` (the reference), bf16 the same round
            with `train.precision: bfloat16` (the forward passes and losses of training and evaluation under
            bfloat16 autocast; pipeline/train/precision.py), set against the bf16 peak.
  the rest  torch.profiler over one more round: each op's self CPU time by op class (convolution, batch norm,
            linear/matmul, optimizer, loss/softmax, data movement, other ops), and Python/other = the round's
            wall time minus all profiled op time (the interpreter, the engine's own code, the profiler's
            overhead between ops); shares of the profiled round's wall time. The profiled round runs the
            vectorized executor's groups one after another (train.side_by_side off), so that its ops are
            profiled on one thread; the timed rounds run them as params.yaml says.

FedCache runs with `round` consistency on both executors (params.yaml's `step` needs the vectorized one; the two
compute the same thing in `round`, as bench/executors.py measures them). Each executor runs `--warmup` untimed
rounds, then `--rounds` timed ones (the best is reported), then the profiled one. Threads: the executor's own
default (1 sequential, every core vectorized: params.yaml's train.threads null) unless --threads.

--harness (implied by --device cuda) builds the rounds with bench/torch_harness.py instead of the stages: torch and
numpy only, as on a bare GPU machine; settings `demo` (the same official demo), `paper` (K = 300 over all 60,000
samples, ResNet-20) and --quick's. On a GPU every timed part ends when the GPU has run it, the peak GEMMs run on it
(fp32 in the TF32 mode cuDNN's convolutions use by default), and the profile sorts the GPU time of the kernels each op
launched (the rest of the round: the GPU idle).

Prints Markdown tables and writes them to bench/results/roofline-<cpu>.md, a file the docs can include (--quick:
bench/.work/roofline/, not the results folder). The demo's figures were measured apart, into
bench/results/roofline-demo-<cpu>.md (`--settings demo --precisions fp32 --out ...`): without bf16 units its
emulated bf16 rounds would take hours; docs/speed.md shows every roofline file of bench/results/. The demo setting dominates the run time: its rounds train 54,000
samples (bench/executors.py measured 158 s sequential, 91 s vectorized per training round on 2 cores), three
rounds per executor with the defaults; --warmup 0 saves one. The other ops class holds activations, residual
additions, pooling and autograd's own bookkeeping. Measure on an idle machine: where other processes take the
cores, the peak and the rounds both come out wrong (--quick figures only show that the script runs).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import os
import platform
import re
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # the pipeline, and the sibling `workspace` (also when imported as bench.roofline)

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # quiet the profiler's GPU probing on a CPU-only machine

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from pipeline.machine import bf16_units as machine_bf16_units  # noqa: E402
from pipeline.machine import cpu_description, cpuinfo_fields  # noqa: E402

EXECUTORS = ("sequential", "vectorized")
PRECISIONS = ("fp32", "bf16")
KNOB = {"fp32": "float32", "bf16": "bfloat16"}  # a precision's train.precision value
OP_CLASSES = ("convolution", "batch norm", "linear/matmul", "optimizer", "loss/softmax", "data movement",
              "other ops", "Python/other")

_BASE = {"train": {"algorithms": ["fedcache"], "rounds": 50, "eval_every": 1}, "fedcache": {"consistency": "round"}}


def _demo() -> dict:
    from fedcache_consistency import OFFICIAL_DEMO

    return OFFICIAL_DEMO


# name -> (what it is, params overrides on top of params.yaml, heterogeneous models)
SETTINGS: dict[str, tuple[str, Any, bool]] = {
    "default": ("params.yaml: K=20 x 100 FashionMNIST samples, ResNet-8", lambda: {}, False),
    "demo": ("the official code's demo: K=20 over all 60,000 FashionMNIST samples, ResNet-8/16/20 by client",
             _demo, True),
    "quick": ("smoke test: K=4 x 50 FashionMNIST samples, 5% of the test set, ResNet-8",
              lambda: {"partition": {"num_clients": 4, "samples_per_client": 50, "test_fraction": 0.05}}, False),
}


# every setting's line in the tables: the stages' (SETTINGS) and the torch-only harness's (HARNESS_SETTINGS)
DESCRIPTIONS = {**{name: desc for name, (desc, _, _) in SETTINGS.items()},
                "paper": "the paper's: K=300 over all 60,000 FashionMNIST samples, ResNet-20 on every client"}


# ------------------------------------------------------------------------------------------------ the machine

def bf16_units(flags: set[str] | frozenset[str] | None = None) -> str | None:
    """The CPU's bf16 instructions among `flags` (default: this CPU's); None: none, so bf16 arithmetic is
    emulated (converted to fp32 and back), slower than fp32."""
    return ", ".join(machine_bf16_units(flags)) or None


NO_UNITS = "emulated, no bf16 units"
BF16_SMALLER = ("without bf16 units the product is emulated, and its rate falls as the matrices outgrow the caches "
                "(a 4096 one ran for minutes without finishing), so the smaller product gives the emulated peak "
                "its best case.")
EMULATED = ("none (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): bf16 is emulated, so its peak and rounds measure "
            "the emulation, slower than fp32")
EMULATED_ROWS = ("Without bf16 units the bf16 rows set emulated convolutions (oneDNN's) against an emulated GEMM "
                 "(torch.mm's), which is no ceiling: a fraction above 100% says the GEMM's emulation is the slower "
                 "of the two, not that the round beat the hardware.")


GPU_PEAK = ("On a GPU the fp32 GEMM runs in the math mode of cuDNN's fp32 convolutions (TF32 tensor cores where "
            "torch.backends.cudnn.allow_tf32, torch's default), their ceiling.")
CPU_PROFILE = ("Self CPU time of each op (torch.profiler) by class; optimizer: everything inside an optimizer step or "
               "zero_grad; data movement: copies, concatenation, indexing, padding, fills; Python/other: the profiled "
               "round's wall time minus all op time (the interpreter, the engine, the profiler's own cost between "
               "ops).")
GPU_PROFILE = ("GPU time of the kernels each op launched (torch.profiler's self device time) by class; optimizer: "
               "everything inside an optimizer step or zero_grad; data movement: copies, concatenation, indexing, "
               "padding, fills; Python/other: the profiled round's wall time minus all kernel time, the GPU idle "
               "(waiting for the Python and the launches that feed it, host-device copies, the profiler's own cost).")


def precision_label(precision: str, units: str | None) -> str:
    """A table's precision cell: bf16 says when it ran without bf16 units."""
    return f"{precision} ({NO_UNITS})" if precision == "bf16" and not units else precision


def cpu_slug() -> str:
    """A file-name form of the CPU: its model name, family and model numbers, and the CPU count."""
    fields = cpuinfo_fields()
    name = fields.get("model name") or platform.processor() or platform.machine()
    name = re.sub(r"\(r\)|\(tm\)|\bcpu\b|\bprocessor\b|@.*$|\d+-core", "", name.lower())
    slug = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"
    if "cpu family" in fields:
        slug += f"-f{fields['cpu family']}m{fields.get('model', '0')}"
    return f"{slug}-{os.cpu_count()}cpu"


def synchronizer(device: str):
    """What waits for `device`'s queued work (a GPU runs ahead of the Python that launches it); nothing on a CPU."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)


def gemm_peak(threads: int, dtype: torch.dtype = torch.float32, n: int = 4096, repeats: int = 5,
              device: str = "cpu") -> float:
    """FLOP/s of the best of `repeats` n x n x n matrix products (2 n^3 FLOPs each) on `threads` torch threads, on
    `device`. On a GPU the fp32 product runs in the math mode cuDNN's convolutions run in (TF32 tensor cores where
    torch.backends.cudnn.allow_tf32, its default), so the rounds' fp32 convolutions are set against their own
    ceiling."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    sync = synchronizer(device)
    cuda = torch.device(device).type == "cuda"
    tf32 = torch.backends.cuda.matmul.allow_tf32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        out = torch.empty(n, n, dtype=dtype, device=device)
        torch.mm(a, b, out=out)  # warm-up: the kernel's first call, the pages of `out`
        per = 10 if cuda else 1  # a GPU's product takes well under a millisecond: time ten between two waits
        best = float("inf")
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            for _ in range(per):
                torch.mm(a, b, out=out)
            sync()
            best = min(best, (time.perf_counter() - start) / per)
        return 2.0 * n**3 / best
    finally:
        torch.set_num_threads(before)
        torch.backends.cuda.matmul.allow_tf32 = tf32


# ------------------------------------------------------------------------------------------------ the work

def forward_flops(model: torch.nn.Module, input_shape: tuple[int, ...]) -> float:
    """FlopCounterMode's FLOPs of one sample's evaluation forward (a copy of the model in eval mode, no grad)."""
    m = copy.deepcopy(model).eval()
    x = torch.zeros(1, *input_shape, device=next(m.parameters()).device)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        m(x)
    return float(counter.get_total_flops())


def train_step_flops(model: torch.nn.Module, input_shape: tuple[int, ...], batch: int = 8) -> float:
    """FlopCounterMode's FLOPs of one training step (forward, cross-entropy, backward) on a copy of the model in
    train mode, per sample of a `batch`-sample step (the input needs no gradient, as in training)."""
    m = copy.deepcopy(model).train()
    device = next(m.parameters()).device
    x = torch.zeros(batch, *input_shape, device=device)
    y = torch.zeros(batch, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(m(x), y).backward()
    return float(counter.get_total_flops()) / batch


@dataclass
class Work:
    """A round's FLOPs and what they are made of."""

    train_samples: int = 0
    eval_samples: int = 0
    train_flops: float = 0.0
    eval_flops: float = 0.0
    per_model: dict[str, tuple[float, float]] = field(default_factory=dict)  # model -> (train/sample, eval/sample)

    @property
    def total(self) -> float:
        return self.train_flops + self.eval_flops


def round_work(sim, round_: int, splits: tuple[str, ...] = ("test", "val")) -> Work:
    """The useful FLOPs of one round of `sim` (a pipeline.train.engine.Simulation): every client trains on the
    samples its local update visits (Simulation.samples_trained) and is evaluated once on each of `splits`."""
    from pipeline.train.executors import architecture

    batch = sim.local.params.train.batch_size
    costs: dict[tuple, tuple[float, float]] = {}
    work = Work()
    for c in sim.clients:
        key = architecture(c.model)
        if key not in costs:
            shape = tuple(c.x_train.shape[1:])
            costs[key] = (train_step_flops(c.model, shape, batch), forward_flops(c.model, shape))
            work.per_model[model_label(c.model)] = costs[key]
        per_train, per_eval = costs[key]
        trained = sim.samples_trained(c, round_)
        evaluated = sum(len(c.y_test if s == "test" else c.y_val) for s in splits)
        work.train_samples += trained
        work.eval_samples += evaluated
        work.train_flops += per_train * trained
        work.eval_flops += per_eval * evaluated
    return work


def model_label(model: torch.nn.Module) -> str:
    """'ResNet-8', 'ResNet-16', 'ResNet-20': the name params.yaml and the official code give the project's ResNets
    (models/resnet.py). Not a count of layers: the official "ResNet-16" (2 blocks a stage) has 14 weighted ones."""
    from models.resnet import ARCHITECTURES, ResNet

    if isinstance(model, ResNet):
        names = {blocks: name for name, blocks in ARCHITECTURES.items()}
        name = names.get(len(model.stages[0]))
        if name is not None:
            return f"ResNet-{name.removeprefix('resnet')}"
    return type(model).__name__


# ------------------------------------------------------------------------------------------------ where time goes

_LINEAR = re.compile(r"aten::(addmm|mm|bmm|baddbmm|matmul|linear|einsum|_addmm_activation)\b")
_LOSS = re.compile(r"softmax|nll_loss|cross_entropy|kl_div|log_softmax|logsumexp")
_MOVE = re.compile(r"aten::(copy_|_to_copy|to|cat|stack|clone|contiguous|index\w*|_index\w*|gather|scatter\w*|take|"
                   r"masked_\w+|constant_pad_nd|pad|repeat|flip|roll|zero_|fill_|zeros|zeros_like|full|full_like|"
                   r"new_zeros|new_full|empty_strided_copy|_unsafe_index\w*)$")


def op_class(name: str) -> str:
    """The op class of a profiler event by its own name (an event inside an optimizer step: see class_shares)."""
    lower = name.lower()
    if name.startswith("Optimizer."):
        return "optimizer"
    if "conv" in lower:
        return "convolution"
    if "batch_norm" in lower:
        return "batch norm"
    if _LINEAR.match(name):
        return "linear/matmul"
    if _LOSS.search(lower):
        return "loss/softmax"
    if _MOVE.match(name):
        return "data movement"
    return "other ops"


class ClassTotals:
    """Self CPU seconds per op class, gathered cycle by cycle from a torch.profiler run (so a long round's events
    are never all held at once). device_time: the GPU seconds of the kernels each op launched itself instead (its
    self device time; the kernels' own events, which would count them twice, are left out)."""

    def __init__(self, device_time: bool = False) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.events = 0
        self.device_time = device_time

    def _self_seconds(self, ev) -> float:
        if not self.device_time:
            return ev.self_cpu_time_total / 1e6
        return ev.self_device_time_total / 1e6 if ev.device_type == torch.autograd.DeviceType.CPU else 0.0

    def add(self, events) -> None:
        in_optimizer: dict[int, bool] = {}

        def inside(ev) -> bool:  # the event is (within) an optimizer step or zero_grad
            if id(ev) not in in_optimizer:
                parent = ev.cpu_parent
                in_optimizer[id(ev)] = ev.name.startswith("Optimizer.") or (parent is not None and inside(parent))
            return in_optimizer[id(ev)]

        for ev in events:
            if ev.name.startswith("ProfilerStep"):  # the span between two profiler steps: its self time is the gaps
                continue
            self.seconds["optimizer" if inside(ev) else op_class(ev.name)] += self._self_seconds(ev)
            self.events += 1

    def shares(self, wall: float) -> dict[str, float]:
        """Each class's share of `wall` seconds, Python/other the remainder; they sum to 1."""
        ops = sum(self.seconds.values())
        total = max(wall, ops)
        out = {c: self.seconds.get(c, 0.0) / total for c in OP_CLASSES[:-1]}
        out["Python/other"] = (total - ops) / total
        return out


@contextlib.contextmanager
def _patched(obj, name: str, wrap):
    original = getattr(obj, name)
    setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        setattr(obj, name, original)


def _labelled(label: str):
    def wrap(fn):
        def inner(*args, **kwargs):
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)
        return inner
    return wrap


@contextlib.contextmanager
def streaming_profile(every: int = 32, device: str = "cpu"):
    """torch.profiler over a block, its events folded into ClassTotals every `every` training steps (a step:
    Client.step on the sequential executor, a grouped step on the vectorized one). The vectorized optimizer
    (GroupedSGD, not a torch Optimizer) is labelled as torch labels its own optimizers. Yields (totals,
    overhead): `overhead[0]`, the seconds spent between cycles (stopping, folding, restarting), belong to no op
    and are to be taken off the block's wall time. On a GPU the totals are the ops' kernel (device) times, and
    each cycle ends once the GPU has run what was launched in it."""
    from models.grouped import GroupedSGD
    from pipeline.federation.clients import Client
    from pipeline.train.executors import GroupRun

    gpu = torch.device(device).type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    totals, overhead, count, sync = ClassTotals(device_time=gpu), [0.0], [0], synchronizer(device)
    prof = torch.profiler.profile(activities=activities,
                                  schedule=lambda step: torch.profiler.ProfilerAction.RECORD_AND_SAVE,
                                  on_trace_ready=lambda p: totals.add(p.events()))

    def ticking(fn):
        def inner(*args, **kwargs):
            out = fn(*args, **kwargs)
            count[0] += 1
            if count[0] % every == 0:
                sync()  # the cycle's kernels run within the block's wall time, not its overhead
                start = time.perf_counter()
                prof.step()
                overhead[0] += time.perf_counter() - start
            return out
        return inner

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(Client, "step", ticking))
        stack.enter_context(_patched(GroupRun, "step", ticking))
        stack.enter_context(_patched(GroupedSGD, "step", _labelled("Optimizer.step#GroupedSGD.step")))
        stack.enter_context(_patched(GroupedSGD, "zero_grad", _labelled("Optimizer.zero_grad#GroupedSGD.zero_grad")))
        with prof:
            yield totals, overhead


@contextlib.contextmanager
def groups_in_turn(executor):
    """The vectorized executor's groups one after another on this thread for the block (train.side_by_side off):
    the profiler's cycles (prof.step at a group's step) and each event's parent follow one thread, and the op times
    sum to no more than the wall time their shares are taken of."""
    was = getattr(executor, "side_by_side", None)
    if was is None:  # not the vectorized executor
        yield
        return
    executor.side_by_side = False
    try:
        yield
    finally:
        executor.side_by_side = was


# ------------------------------------------------------------------------------------------------ one executor

def executor_params(params, executor: str, threads: int | None, precision: str = "fp32"):
    """params with the executor, its torch threads and the precision (fp32 | bf16) set, FedCache in `round`
    consistency."""
    train = params.train.model_copy(update={"executor": executor, "threads": threads, "precision": KNOB[precision]})
    return params.model_copy(update={"train": train,
                                     "fedcache": params.fedcache.model_copy(update={"consistency": "round"})})


def default_threads(executor: str) -> int:
    from pipeline.train.executors import SequentialExecutor, VectorizedExecutor

    return (SequentialExecutor if executor == "sequential" else VectorizedExecutor).threads


def timed_round(sim, round_: int, train, device: str = "cpu") -> tuple[float, float]:
    """`train()`, one round's training (selection, downloads, local training, uploads, aggregation), then every
    client of `sim` evaluated on its test and validation splits, in the run's train.precision; on a GPU each part
    ends when the GPU has run it. Returns (training seconds, evaluation seconds)."""
    sync = synchronizer(device)
    sync()
    start = time.perf_counter()
    train()
    sync()
    trained = time.perf_counter()
    sim.evaluate(round_)
    if any(len(c.y_val) for c in sim.clients):
        sim.evaluate(round_, "val")
    sync()
    return trained - start, time.perf_counter() - trained


def run_round(trainer, round_: int) -> tuple[float, float]:
    """One round as the training stage runs it, less its results and checkpoint writes: the schedule's round, then
    the evaluations (timed_round)."""
    from pipeline.train.engine import Timer

    return timed_round(trainer.sim, round_, lambda: trainer.schedule.run(round_, Timer()))


def measure_rounds(sim, play, *, executor: str, precision: str, threads: int, rounds: int, warmup: int,
                   profile: bool, device: str = "cpu") -> dict:
    """`warmup` untimed rounds of `sim`, `rounds` timed ones (the best kept), then (with `profile`) one profiled
    round; play(r) runs round r and returns its (training, evaluation) seconds."""
    splits = ("test", "val") if any(len(c.y_val) for c in sim.clients) else ("test",)
    times, r = [], 0
    for r in range(1, warmup + rounds + 1):
        seconds = play(r)
        if r > warmup:
            times.append(seconds)
    best = min(times, key=sum)
    out = {"executor": executor, "precision": precision, "threads": threads, "train_s": best[0], "eval_s": best[1],
           "round_s": sum(best), "rounds_s": [sum(t) for t in times], "work": round_work(sim, r, splits),
           "batch": sim.local.params.train.batch_size, "clients": len(sim.clients)}
    if torch.device(device).type == "cuda":
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if profile:
        with groups_in_turn(sim.executor), streaming_profile(device=device) as (totals, overhead):
            start = time.perf_counter()
            play(r + 1)
            wall = time.perf_counter() - start - overhead[0]
        out.update(profiled_s=wall, shares=totals.shares(wall), events=totals.events)
    return out


def measure_executor(params, part, ds, executor: str, *, hetero: bool = False, threads: int | None = None,
                     precision: str = "fp32", rounds: int = 1, warmup: int = 1, profile: bool = True,
                     run_name: str | None = None) -> dict:
    """A fresh FedCache Trainer (bench/workspace.py) on `executor`, measured by measure_rounds. In the current
    workspace (load_workspace or a test's tmp dir)."""
    from workspace import fresh_trainer

    threads = threads or default_threads(executor)
    params = executor_params(params, executor, threads, precision)
    trainer = fresh_trainer(params, "fedcache", part, ds, run_name=run_name or f"roofline-{executor}-{precision}",
                            hetero=hetero)
    try:
        torch.set_num_threads(threads)
        trainer.start()  # round 0: the set-up uploads
        return measure_rounds(trainer.sim, functools.partial(run_round, trainer), executor=executor,
                              precision=precision, threads=threads, rounds=rounds, warmup=warmup, profile=profile)
    finally:
        trainer.close()


# ------------------------------------------------------------------------------------------------ torch alone

# roofline setting -> bench/torch_harness.py's (torch and numpy only: a bare GPU machine, bench/gpu_check.sh)
HARNESS_SETTINGS = {"demo": "official", "paper": "paper", "quick": "quick"}


def measure_harness(setting: str, executor: str, *, device: str = "cpu", threads: int | None = None,
                    precision: str = "fp32", rounds: int = 1, warmup: int = 1, profile: bool = True,
                    group_size: int = 32, synthetic: bool = False) -> dict:
    """measure_executor's figures for FedCache (`round` consistency) built by bench/torch_harness.py on `device`:
    no pipeline stage, no service library (the harness's hash and neighbours stand in for the stages', which
    changes no round's cost); every client trains every round."""
    import torch_harness as h

    from pipeline.train.engine import Timer
    from pipeline.train.executors import SequentialExecutor, VectorizedExecutor

    threads = threads or default_threads(executor)
    torch.set_num_threads(threads)
    sim, _ = h.build(HARNESS_SETTINGS[setting], "round", device, group_size, synthetic, precision=KNOB[precision])
    sim.executor = SequentialExecutor() if executor == "sequential" else VectorizedExecutor(group_size)
    everyone = list(range(len(sim.clients)))

    def play(r: int) -> tuple[float, float]:
        return timed_round(sim, r, lambda: sim.run_round(r, everyone, Timer()), device)

    return measure_rounds(sim, play, executor=executor, precision=precision, threads=threads, rounds=rounds,
                          warmup=warmup, profile=profile, device=device)


def achieved(result: dict, peak: float) -> float:
    """The round's useful FLOPs a second as a fraction of `peak` FLOP/s."""
    return result["work"].total / result["round_s"] / peak


# ------------------------------------------------------------------------------------------------ the tables

def markdown(header: dict, peaks: dict[tuple[int, str], float | None], results: dict[str, list[dict]],
             gemm_n: int, bf16_gemm_n: int | None = None) -> str:
    units = header.get("bf16_units")  # the CPU's bf16 instructions (a GPU: its tensor cores), None: none
    gpu = header.get("gpu", False)
    lines = [f"# Roofline: FedCache rounds against the {'GPU' if gpu else 'CPU'}'s peak ({header['cpu']})", "",
             f"Measured {header['date']} with `{header['command']}`: torch {torch.__version__}, "
             f"{header['cpu']}; FedCache with `round` consistency, batch {header['batch']}. "
             "Round times are training + evaluation (test and validation splits), the best of the timed rounds; "
             "FLOPs count convolutions and matrix products (torch.utils.flop_counter), not BatchNorm, activations "
             "or the optimizer.", "",
             f"## Peak: a {gemm_n} x {gemm_n} GEMM, best of the repeats", "",
             f"bf16 units: {units or EMULATED}.", "",
             *([GPU_PEAK, ""] if gpu else []),
             *([f"The bf16 GEMM is {bf16_gemm_n} x {bf16_gemm_n}: {BF16_SMALLER}", ""]
               if bf16_gemm_n and bf16_gemm_n != gemm_n else []),
             "| torch threads | fp32 GFLOP/s | bf16 GFLOP/s |", "|---|---|---|"]
    for threads in sorted({t for t, _ in peaks}):
        bf16 = peaks.get((threads, "bf16"))
        lines.append(f"| {threads} | {peaks[(threads, 'fp32')] / 1e9:.1f} | "
                     + (f"{bf16 / 1e9:.1f}{'' if units else f' ({NO_UNITS})'}" if bf16 else "not measured") + " |")
    lines += ["", "## The work of one round", "",
              "| setting | clients | models: MFLOP per sample, train step (fwd+bwd) / eval forward | samples trained "
              "| samples evaluated | GFLOP per round: train + eval = total |", "|---|---|---|---|---|---|"]
    for setting, runs in results.items():
        runs = [r for r in runs if "work" in r]
        if not runs:
            continue
        w = runs[0]["work"]
        models = ", ".join(f"{m} {tr / 1e6:.2f} / {ev / 1e6:.2f}" for m, (tr, ev) in w.per_model.items())
        lines.append(f"| {setting}: {DESCRIPTIONS[setting]} | {runs[0]['clients']} | {models} | {w.train_samples:,} | "
                     f"{w.eval_samples:,} | {w.train_flops / 1e9:.2f} + {w.eval_flops / 1e9:.2f} = "
                     f"{w.total / 1e9:.2f} |")
    lines += ["", "## Achieved", "",
              "| setting | executor | precision | torch threads | train s | eval s | round s | achieved GFLOP/s "
              "| peak GFLOP/s (GEMM) | fraction of peak | round s at the peak |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for setting, runs in results.items():
        for r in runs:
            label = precision_label(r["precision"], units)
            rate = r["work"].total / r["round_s"]
            peak = peaks[(r["threads"], r["precision"])]
            lines.append(f"| {setting} | {r['executor']} | {label} | {r['threads']} | {r['train_s']:.2f} | "
                         f"{r['eval_s']:.2f} | {r['round_s']:.2f} | {rate / 1e9:.2f} | {peak / 1e9:.1f} | "
                         f"{rate / peak:.1%} | {r['work'].total / peak:.2f} |")
    if not units and any(r["precision"] == "bf16" for runs in results.values() for r in runs):
        lines += ["", EMULATED_ROWS]
    profiled = [(s, r) for s, runs in results.items() for r in runs if "shares" in r]
    if profiled:
        lines += ["", "## Where the time goes: one profiled round, shares of its wall time", "",
                  "| setting | executor | precision | profiled round s | " + " | ".join(OP_CLASSES) + " |",
                  "|---|---|---|---|" + "---|" * len(OP_CLASSES)]
        for setting, r in profiled:
            lines.append(f"| {setting} | {r['executor']} | {precision_label(r['precision'], units)} | "
                         f"{r['profiled_s']:.2f} | "
                         + " | ".join(f"{r['shares'][c]:.1%}" for c in OP_CLASSES) + " |")
        lines += ["", (GPU_PROFILE if gpu else CPU_PROFILE) + " The profiler slows a round down, so its seconds "
                  "exceed the timed ones. The profiled round runs the vectorized executor's groups one after another "
                  "on one thread (train.side_by_side off), where the timed rounds may run them side by side."]
    return "\n".join(lines) + "\n"


def device_slug(device: str) -> str:
    """The results file's name part: the CPU's (cpu_slug), or 'gpu-' and the GPU's model name."""
    if torch.device(device).type != "cuda":
        return cpu_slug()
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", choices=["default", "demo", "paper"], default=None,
                    help="default: default and demo (with --harness: demo and paper)")
    ap.add_argument("--executors", nargs="+", choices=EXECUTORS, default=list(EXECUTORS))
    ap.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS),
                    help="train.precision of the rounds: fp32 (float32) and bf16 (bfloat16 autocast; emulated, so "
                         "slower, on a CPU without bf16 units)")
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds per executor (the best is reported)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds before them")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of every executor (default: its own, 1 sequential, all cores vectorized)")
    ap.add_argument("--gemm-n", type=int, default=None,
                    help="the peak GEMM's matrix size (default 4096, 8192 on a GPU)")
    ap.add_argument("--bf16-gemm-n", type=int, default=None,
                    help="the bf16 peak GEMM's size (default: --gemm-n on a CPU with bf16 units, else 1024: the "
                         "emulated product is too slow at 4096)")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled round")
    ap.add_argument("--quick", action="store_true", help="the small `quick` setting, a 1024 GEMM: a smoke test")
    ap.add_argument("--device", default="cpu", help="where the rounds run: cpu, or cuda (implies --harness)")
    ap.add_argument("--harness", action="store_true",
                    help="build the rounds with bench/torch_harness.py (torch and numpy only: no stage, no service "
                         "library), settings demo and paper (and --quick)")
    ap.add_argument("--group-size", type=int, default=32, help="with --harness: clients per grouped network")
    ap.add_argument("--synthetic", action="store_true", help="with --harness: random images of FashionMNIST's shape")
    ap.add_argument("--out", type=Path, default=None,
                    help="the Markdown file (default: roofline-<cpu>.md, roofline-gpu-<gpu>.md on a GPU, in --out-dir)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results",
                    help="the default file's folder (--quick: bench/.work/roofline)")
    args = ap.parse_args()
    gpu = torch.device(args.device).type == "cuda"
    harness = args.harness or gpu
    settings = ["quick"] if args.quick else args.settings or (["demo", "paper"] if harness else ["default", "demo"])
    wrong = [s for s in settings if s not in (HARNESS_SETTINGS if harness else SETTINGS)]
    if wrong:
        ap.error(f"setting {', '.join(wrong)}: "
                 + ("with --harness (or a GPU) choose from demo, paper" if harness else "needs --harness"))

    gemm_n = 1024 if args.quick else args.gemm_n or (8192 if gpu else 4096)
    units = "tensor cores" if gpu else bf16_units()
    bf16_gemm_n = args.bf16_gemm_n or (gemm_n if units else min(gemm_n, 1024))
    cpu = cpu_description()
    where = f"{torch.cuda.get_device_name(args.device)} (CUDA; host: {cpu})" if gpu else cpu
    print(f"# {where}; bf16 units: {units or 'none'}; torch {torch.__version__}", flush=True)

    threads_used = sorted({args.threads or default_threads(e) for e in args.executors})
    peaks: dict[tuple[int, str], float | None] = {}
    for threads in threads_used:
        peaks[(threads, "fp32")] = gemm_peak(threads, torch.float32, gemm_n, device=args.device)
        peaks[(threads, "bf16")] = gemm_peak(threads, torch.bfloat16, bf16_gemm_n, device=args.device)
        print(f"peak, {threads} threads: fp32 {peaks[(threads, 'fp32')] / 1e9:.1f} GFLOP/s, "
              f"bf16 {peaks[(threads, 'bf16')] / 1e9:.1f} GFLOP/s{'' if units else f' ({NO_UNITS})'}", flush=True)

    results: dict[str, list[dict]] = {}
    batch = None
    for setting in settings:
        results[setting] = []
        if harness:
            measure = functools.partial(measure_harness, setting, device=args.device, group_size=args.group_size,
                                        synthetic=args.synthetic)
        else:
            from workspace import deep_merge, load_workspace, prepare_workspace

            _, overrides, hetero = SETTINGS[setting]
            work = prepare_workspace(f"roofline/{setting}", deep_merge(overrides(), _BASE),
                                     ("partition", "encode", "index"))
            measure = functools.partial(measure_executor, *load_workspace(work), hetero=hetero)
        for executor in args.executors:
            for precision in args.precisions:
                r = measure(executor, threads=args.threads, precision=precision, rounds=args.rounds,
                            warmup=args.warmup, profile=not args.no_profile)
                results[setting].append(r)
                batch = r["batch"]
                peak = peaks[(r["threads"], precision)]
                print(f"{setting} {executor} {precision_label(precision, units)}, {r['threads']} threads: "
                      f"round {r['round_s']:.2f} s "
                      f"(train {r['train_s']:.2f}, eval {r['eval_s']:.2f}), {r['work'].total / 1e9:.2f} GFLOP, "
                      f"{achieved(r, peak):.1%} of the GEMM peak"
                      + (f", peak GPU memory {r['peak_gpu_gb']:.2f} GiB" if "peak_gpu_gb" in r else ""), flush=True)
        os.chdir(ROOT)  # load_workspace changed into the setting's folder

    header = {"cpu": where, "date": datetime.date.today().isoformat(), "batch": batch, "bf16_units": units,
              "gpu": gpu, "command": shlex.join(["python", "bench/roofline.py", *sys.argv[1:]])}
    table = markdown(header, peaks, results, gemm_n, bf16_gemm_n)
    out = args.out or ((ROOT / "bench" / ".work" / "roofline" if args.quick else args.out_dir) /
                       f"roofline-{device_slug(args.device)}{'-quick' if args.quick else ''}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    print("\n" + table + f"\nwritten to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
