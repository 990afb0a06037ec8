"""The round loop shared by every method.

`Simulation` is the federation itself, with no files: the clients, the method's client half and
server half, the byte ledger and the executor. `Trainer` runs it: resume or start, the rounds,
the results file and the checkpoint.

One round, top to bottom (Simulation.run_round, then Trainer._finish_round):
  1. pick the participating clients (seeded, `train.participation`);
  2. the method's server half makes each selected client's download (`configure`);
  3. the executor runs the client halves (local training) and collects their uploads (each
     selected client gets a fresh SGD optimizer first when `train.fresh_optimizer` is on); with `train.dp_noise`,
     each upload is clipped and noised as it leaves its client (`Simulation.noised`, pipeline/federation/dp_noise.py);
  4. the server half folds the uploads into its state (`aggregate`);
  5. every `eval_every` rounds, evaluate *all* clients on their own test split (a client task
     the executor runs; the server half turns the clients' accuracies into the round's figures);
  6. write the round to the run's results file (one transaction) and checkpoint it atomically.
The engine records every payload that crosses steps 2-4 (and the per-step exchange hook) in the
byte ledger, so no method counts its own bytes.

With `devices.enabled`, a simulated clock (pipeline/federation/clock.py) times each round on the
clients' devices: between steps 3 and 4 it decides, from the bytes and samples of each client, when
each upload completes and when the round ends (`train.schedule`); under `deadline` the clients that
miss it are dropped there: their uploads are neither counted nor aggregated. Every round row and
ledger row then carries its simulated instant; wall time is measured as before. Who trains when is the
schedule's (`train.schedule`, pipeline/train/schedules/): sync and deadline run the rounds above (step 1 is
theirs); under async there are no rounds to run: it runs the clients' updates event by event through the
same Simulation, and a "round" is a fixed span of simulated time, evaluated and written as a round is (steps 5
and 6).

Round 0 is set-up: the clients' one-time uploads (FedCache's hash codes) and an evaluation of
the initial models. Client state (model, optimizer) persists across rounds. Randomness comes
from named seed streams keyed by (round, client), so a resumed run draws exactly what an
uninterrupted one would, whichever executor runs it.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline import method_catalog
from pipeline.capabilities import Supports, executor_for, noise_refusal, refusals
from pipeline.data.datasets import ImageDataset
from pipeline.data.partition import Partition
from pipeline.machine import run_environment
from pipeline.torch_device import resolve_device
from pipeline.errors import ConfigError
from pipeline.federation.clients import Client, build_clients, on_split
from pipeline.federation.clock import ClientTime, Clock, RoundPlan, build_clock
from pipeline.federation.devices import population
from pipeline.federation.contract import LocalUpdate, Server, ServerContext, Upload
from pipeline.federation.dp_noise import UploadNoise
from pipeline.federation.ledger import DOWN, SERVER, SETUP_ROUND, UP, Ledger, Payload
from pipeline.results.labels import run_label
from pipeline.train import checkpoint
from pipeline.train.capture import Capture
from pipeline.train.executors import SequentialExecutor, StepHook, VectorizedExecutor
from pipeline.train.precision import resolved_precision
from pipeline.train.schedules import schedule_class
from pipeline.train.schedules.base import Schedule

if TYPE_CHECKING:  # the training core runs without the service libraries (bench/gpu_check.sh)
    from pipeline.config import Params
    from pipeline.results.store import ResultsDB

# oneDNN (torch's CPU convolutions) keeps this many compiled convolution kernels ("primitives"); its default, 1024, is
# fewer than a round of the vectorized executor meets (each group's grouped steps, forward and backward, then every
# client's own model on its splits), so every round compiled its kernels again. 4096 keeps them: a training stage
# 1.2-1.4x faster, the same results (bench/primitive_cache.py, docs/executors.md).
PRIMITIVE_CACHE = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "4096")


def keep_compiled_kernels(environ=os.environ) -> None:
    """The capacity, unless the environment sets one. oneDNN reads it at the process's first convolution, which in
    a training stage comes after this module is imported (it calls this below)."""
    environ.setdefault(*PRIMITIVE_CACHE)


# glibc lets threads that allocate take up to 8 malloc arenas a core, and memory freed into one arena is not reused by
# another: with the lanes' worker threads (pipeline/train/lanes.py) stepping every group of a FedCache `step` round at
# paper scale (K = 300, hetero), peak RSS was 3.87-4.20 GiB over five runs, over the 4 GiB bound in four. One arena a
# core plus one (each lane, the main thread) measured 3.63-3.85 GiB (3 runs) with the official demo's round as fast
# (38.9-42.4 s against 40.5-42.5); a single arena 3.51-3.70 GiB, but the demo's lanes then wait on its lock: 47.0-48.7 s
# (bench/scaling.py's fedcache-step cell, bench/official_round.py's step row; 2 cores; docs/speed.md).
MALLOC_ARENAS = ("MALLOC_ARENA_MAX", (os.cpu_count() or 1) + 1)
M_ARENA_MAX = -8  # glibc's mallopt parameter number


def share_malloc_arenas(environ=os.environ) -> bool:
    """At most MALLOC_ARENAS' count of malloc arenas for the process's threads, unless the environment sets
    MALLOC_ARENA_MAX (glibc then reads it itself) or the C library has no such setting. Threads that allocate later
    (the lanes) are bound by it. Returns whether it was set."""
    if MALLOC_ARENAS[0] in environ:
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        libc.gnu_get_libc_version  # glibc's; another C library's mallopt would read -8 as something else
        return bool(libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS[1]))
    except (OSError, AttributeError):
        return False


keep_compiled_kernels()
share_malloc_arenas()


class Timer:
    """Wall seconds per named section within a round (for the benchmark)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def reset(self) -> None:
        self.seconds.clear()


@dataclass(frozen=True)
class RunInfo:
    """What a run records about where it ran, given by its caller (the training flow reads git and
    DVC; the engine calls neither): the code's git revision, and the DVC experiment it ran in with
    the params that experiment changed (for sweeps)."""

    git_revision: str = "unknown"
    experiment: str | None = None
    changed: dict | None = None


def fingerprint(params: Params, algorithm: str, files: list[Path]) -> str:
    """Identifies a run's inputs; a checkpoint is resumed only when this matches."""
    h = hashlib.sha256(json.dumps({"algorithm": algorithm, "params": params.model_dump(mode="json", by_alias=True)},
                                  sort_keys=True).encode())
    for f in files:
        h.update(Path(f).read_bytes() if Path(f).is_file() else b"-")
    return h.hexdigest()


class Simulation:
    """The federation, in memory: the clients, the method's two halves, the byte ledger, the executor.

    The engine owns the boundary between the halves: every payload that crosses it (set-up,
    downloads, the per-step hook, uploads) is counted in the ledger by `count`, and only there. A schedule
    (pipeline/train/schedules/) decides who trains when and what they read, and drives the simulation
    through its steps: `run_round` (a round, for the schedules that have rounds) or `configure`,
    `deliver`, `train_one`, `receive` and `arrive` (one client's update at a time, async)."""

    def __init__(self, method_cls: type[Server], clients: list[Client], ctx: ServerContext, executor,
                 local: LocalUpdate | None = None):
        self.clients = clients
        self.local = local if local is not None else method_cls.client_cls(ctx.params, ctx.num_classes)
        self.server = method_cls(ctx)  # a method's ConfigError comes before any client work
        for client in clients:
            self.local.prepare(client)
        self.executor = executor
        self.ledger = Ledger()
        self.fresh_optimizer = ctx.params.train.fresh_optimizer
        self.local_epochs = ctx.params.train.local_epochs
        self.last_round = ctx.params.train.rounds
        self.clock: Clock | None = None  # the simulated clock (devices.enabled), set by the trainer
        self.last_plan: RoundPlan | None = None  # what the clock decided about the latest round
        self.capture: Capture | None = None  # the privacy audit's sample of the uploads (audit.capture), set by the trainer
        self.noise = upload_noise(ctx.params, method_cls.name)  # train.dp_noise: None when off

    # -- the ledger: written here and only here; deliver and receive are the boundary every payload crosses --

    def count(self, round_: int, client: int, direction: str, payload: Payload, peer: int = SERVER,
              at: float | None = None) -> None:
        """A payload crossed the boundary in `round_`: count it on `client`'s row (and, with the clock, the
        simulated instant it completed)."""
        self.ledger.record(round_, client, direction, payload, peer=peer)
        if self.capture is not None:
            self.capture.seen(round_, client, direction, payload, peer)
        if at is not None:
            self.ledger.stamp(round_, client, direction, payload.kind, at, peer=peer)

    def deliver(self, round_: int, client: int, payloads: list[Payload], at: float | None = None) -> None:
        """What `client` received: from the server, a download; from another client over a directed edge,
        counted once, on the sender's side, as its upload to `client`."""
        for p in payloads:
            if p.sender is None:
                self.count(round_, client, DOWN, p, at=at)
            else:
                self.count(round_, p.sender, UP, p, peer=client, at=at)

    def receive(self, round_: int, client: int, upload: Upload, at: float | None = None) -> None:
        """What `client` sent the server (at the end of its update, or in a per-step exchange). Its relayed
        payloads (decentralized methods) are counted where they travel: delivered to a peer, `deliver`."""
        for p in upload.payloads:
            self.count(round_, client, UP, p, at=at)

    # -- the noise on uploads (train.dp_noise): applied where an upload leaves its client --

    # Where: as the client half hands its upload over (the executor's return, the per-step hook's call), before
    # `count` (the ledger, and the audit's capture, which sees what the server holds) and before the server half reads
    # it, so the server only ever receives noised values, whichever executor or schedule ran the client. A method
    # encodes its upload inside its client half (encode_up), before this point: the noise needs float32 there
    # (refused otherwise, pipeline/capabilities.py), as it is added to the values as computed.

    def noised(self, round_: int, client: int, upload: Upload, download: list[Payload]) -> Upload:
        """A round's upload as it leaves `client` (`download`: what it received, which a model's change is read
        against); unchanged with the noise off."""
        if self.noise is None:
            return upload
        return Upload(self.noise.apply(round_, client, upload.payloads, download), upload.relay, upload.metrics)

    # -- steps -----------------------------------------------------------------------------------

    def setup(self) -> None:
        """Round 0: every client's one-time upload, counted as set-up traffic, to the server half."""
        uploads = {c.id: self.local.setup(c) for c in self.clients}
        done = {} if self.clock is None else self.clock.setup(
            {k: sum(p.nbytes for p in u.payloads) for k, u in uploads.items()})
        for k, upload in uploads.items():
            self.receive(SETUP_ROUND, k, upload, done.get(k))
        self.server.setup(uploads)

    def samples_trained(self, client: Client, round_: int) -> int:
        """The samples a client's local update trains on: every phase's pass over its data, each batch `repeat` times."""
        return sum(self.local_epochs * client.num_train * phase.repeat for phase in self.local.phases(round_))

    def run_round(self, round_: int, selected: list[int], timer: Timer | None = None,
                  deadline: Callable[[float, dict[int, ClientTime]], float | None] | None = None) -> None:
        """One round of training, top to bottom: downloads, local updates, uploads, aggregation. With the clock,
        `deadline(start, times)` (the schedule's) is the instant the round closes at, None: its last upload."""
        timer = timer or Timer()
        server, clock = self.server, self.clock
        start = 0.0
        if clock is not None:  # the selected clients offline when the round starts sit it out
            start, selected = clock.begin_round(selected)
        # the per-step exchange's payloads, per client: (payloads sent, payloads received), counted after the
        # round when their instants are known
        exchanged: dict[int, tuple[list[Payload], list[Payload]]] = defaultdict(lambda: ([], []))

        def exchange(round_: int, uploads: dict[int, Payload]) -> dict[int, Payload]:
            """The per-step hook: the step's uploads to the server half, its answers back."""
            with timer("exchange"):
                if self.noise is not None:  # each step's upload is a release of its own (index: 1 + the step)
                    uploads = {k: self.noise.apply(round_, k, [p], index=1 + len(exchanged[k][0]))[0]
                               for k, p in uploads.items()}
                for k, p in uploads.items():
                    exchanged[k][0].append(p)
                downloads = server.exchange(round_, uploads)
                for k, p in downloads.items():
                    exchanged[k][1].append(p)
                return downloads

        with timer("exchange"):
            downloads = server.configure(round_, selected)
        down_bytes = {k: sum(p.nbytes for p in downloads[k]) for k in selected}
        # a client whose connection drops before its download completes never gets it: not counted, not trained
        received = selected if clock is None else clock.receivers(start, down_bytes)
        if self.fresh_optimizer:  # the official FedCache code builds a new SGD every round
            for k in received:
                self.clients[k].new_optimizer()
        uploads = self.executor.run(self.local, [self.clients[k] for k in received], downloads, round_,
                                    StepHook(exchange, server.end_step)) if received else {}
        uploads = {k: self.noised(round_, k, u, downloads[k]) for k, u in uploads.items()}
        kept, plan = selected, None
        if clock is not None:  # when each upload would complete, who is kept, when the round ends
            times = {k: clock.client_time(
                k, self.samples_trained(self.clients[k], round_)
                + self.local.extra_samples(self.clients[k], uploads[k], round_), down_bytes[k],
                sum(p.nbytes for p in uploads[k].payloads),
                *(sum(p.nbytes for p in sent) for sent in exchanged[k])) if k in uploads
                else clock.client_time(k, 0, down_bytes[k], 0) for k in selected}  # cut short: dropped as offline
            plan = clock.close(start, times, None if deadline is None else deadline(start, times))
            kept = plan.kept
        self.last_plan = plan
        with timer("exchange"):
            for k in received:  # each download completes when its client's does; the exchange with its local work
                self.deliver(round_, k, downloads[k], None if plan is None else plan.start + plan.times[k].downloaded)
                at = None if plan is None else plan.start + plan.times[k].trained
                self.receive(round_, k, Upload(exchanged[k][0]), at)
                self.deliver(round_, k, exchanged[k][1], at)
            for k in kept:
                self.receive(round_, k, uploads[k], None if plan is None else plan.finish(k))
            if len(kept) < len(selected):  # dropped: what they trained never reaches the server
                arrived = set(kept)
                uploads = {k: u for k, u in uploads.items() if k in arrived}
            if uploads:  # every participant dropped: the server has nothing to fold in
                server.aggregate(round_, uploads)
        work = server.take_work()  # the server's compute of the round: timed after its last upload
        if clock is not None:
            clock.serve(work)
        if round_ == self.last_round:
            self.final_downloads(round_)

    def final_downloads(self, round_: int) -> None:
        """After the last round: what the server sends every client for the last evaluation to read
        (`Server.final_downloads`), counted as the round's downloads; with the clock, each completes over its
        client's downlink from the round's end, and the round ends when the last has (Clock.deliver)."""
        finals = self.server.final_downloads(round_)
        done = {} if self.clock is None or not finals else self.clock.deliver(
            {k: sum(p.nbytes for p in payloads) for k, payloads in finals.items()})
        for k, payloads in finals.items():
            self.deliver(round_, k, payloads, done.get(k))

    def train_one(self, client: int, download: list[Payload], number: int) -> Upload:
        """One client's local update on its own (the async schedule), seeded by the update's number as a sync
        round by its number; a fresh optimizer first when `train.fresh_optimizer` is on."""
        if self.fresh_optimizer:
            self.clients[client].new_optimizer()
        upload = SequentialExecutor.run_client(self.local, self.clients[client], download, number)
        return self.noised(number, client, upload, download)

    def evaluate(self, round_: int, split: str = "test") -> tuple[list[tuple[int, float, int]], dict[str, float]]:
        """Every client on its own `split` ("test", or "val" for the validation split defaults are tuned
        on), a client task run by the executor; the server half makes the round's (client, acc, n) rows
        and extra metrics of them."""
        with on_split(self.clients, split):
            evaluations = self.executor.evaluate(self.local, self.clients, self.server.evaluation(round_))
        return self.server.report(round_, evaluations)


def make_executor(params: Params, method_cls: type[Server], local: LocalUpdate,
                  schedule_cls: type[Schedule] | None = None):
    """The executor `train.executor` asks for, or the sequential one (saying why) where the method's declaration
    (`supports`, pipeline/capabilities.py) says the asked one cannot run it, or the schedule trains one client's
    update at a time, each at its own simulated instant (async)."""
    name = method_cls.name
    executor, why = executor_for(name, method_supports(params, name), getattr(params, name), params.train.executor)
    if executor != "sequential" and schedule_cls is not None and schedule_cls.one_client_at_a_time:
        executor, why = "sequential", (f"train.schedule {schedule_cls.name} trains one client's update at a time, "
                                       "each at its own simulated instant")
    if why:
        print(f"{name}: runs on the sequential executor ({why})", flush=True)
    if executor == "sequential":
        return SequentialExecutor()
    if executor == "dask":
        from pipeline.train.dask_executor import DaskExecutor  # Prefect and Dask only when asked for

        return DaskExecutor(params.train.dask_address, params.train.dask_workers)
    return VectorizedExecutor(params.train.group_size, params.train.side_by_side)


def upload_noise(params: Params, name: str) -> UploadNoise | None:
    """The noise on the method's uploads `train.dp_noise` asks for (None: off); a ConfigError when its declaration
    says the noise cannot cover it (params validation says so first; params built in code skip that)."""
    t = params.train
    if t.dp_noise == 0:
        return None
    supports = method_supports(params, name)
    why = noise_refusal(name, supports, getattr(params, name), t.dp_noise)
    if why:
        raise ConfigError(why)
    return UploadNoise(t.dp_noise, t.dp_clip, t.dp_delta, params.seed, supports.noise.change)


def method_supports(params: Params, name: str) -> Supports:
    """The method's declaration of what it supports (its params section's class)."""
    return method_catalog.params_class(name).supports


class Trainer:
    def __init__(self, params: Params, method_cls, part: Partition, ds: ImageDataset, run_dir: Path,
                 checkpoint_path: Path, results: ResultsDB, input_files: list[Path] | None = None, hetero: bool = False,
                 run_info: RunInfo = RunInfo()):
        self.run_info = run_info
        schedule_cls = schedule_class(params.train.schedule)  # the params schema has checked its devices
        name, t = method_cls.name, params.train
        # what the method supports, as params validation checks it (params built in code skip that)
        found = refusals(name, method_supports(params, name), getattr(params, name), t.executor, t.schedule, hetero)
        if found:
            raise ConfigError(found[0])
        local = method_cls.client_cls(params, ds.num_classes)
        executor = make_executor(params, method_cls, local, schedule_cls)
        torch.set_num_threads(params.train.threads or executor.threads)
        self.params = params
        self.device = resolve_device(params.device)
        self.results = results
        self.checkpoint_path = Path(checkpoint_path)
        self.dataset_name = ds.name
        run_dir.mkdir(parents=True, exist_ok=True)
        self.hetero = hetero
        self.setting = "hetero" if hetero else "homo"
        ctx = ServerContext(params, part.num_clients, ds.num_classes, ds.input_shape, part, self.device, run_dir,
                            hetero)
        devices = population(params.devices, part.num_clients, params.seed) if params.devices.enabled else None
        self.sim = Simulation(method_cls, build_clients(params, part, ds, self.device, hetero), ctx, executor, local)
        if devices is not None:
            self.sim.clock = build_clock(params, devices, [c.model for c in self.sim.clients], ds.input_shape,
                                         ds.num_classes)
        self.schedule = schedule_cls(self.sim, params, run_dir)
        self.run_dir = run_dir
        if params.audit.capture:
            a = params.audit
            self.sim.capture = Capture(params.seed, part.num_clients, a.clients, a.rows, params.train.rounds)
        self.timer = Timer()
        self.seconds: dict[str, float] = defaultdict(float)  # this process's totals per section, for summary.json
        inputs = method_cls.inputs() if input_files is None else input_files
        if params.devices.enabled and params.devices.trace is not None:  # a checkpoint resumes only on the same trace
            inputs = [*inputs, Path(params.devices.trace)]
        self.fingerprint = fingerprint(params, f"{self.server.name}-{self.setting}", inputs)
        self.run_id = ""
        self.history: list[tuple[int, float | None]] = []
        self.val_history: list[tuple[int, float | None]] = []

    @property
    def clients(self) -> list[Client]:
        return self.sim.clients

    @property
    def executor(self):
        return self.sim.executor

    @executor.setter
    def executor(self, executor) -> None:
        self.sim.executor = executor

    @property
    def ledger(self) -> Ledger:
        return self.sim.ledger

    def environment(self) -> dict:
        """Where and how this run computes: the machine's record (pipeline.machine.run_environment) with the torch
        threads and device, the precision `train.precision` resolved to there, and the accelerator's name where there
        is one."""
        device = self.sim.server.ctx.device
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        return {**run_environment(), "torch_threads": torch.get_num_threads(), "device": str(device), "gpu": gpu,
                "precision": resolved_precision(self.params.train.precision, device)}

    @property
    def server(self) -> Server:
        """The method's server half."""
        return self.sim.server

    # -- the loop --------------------------------------------------------------------

    def start(self) -> int:
        """Resume from a matching checkpoint whose rows the results file holds, or start a new run with round 0
        (set-up; a per-run results file is cleared first, see pipeline.results.store.RunResultsDB). Returns the next round."""
        state = checkpoint.load(self.checkpoint_path)
        if state is not None and state["fingerprint"] == self.fingerprint:
            problem = self.results.resume_problem(state["run_id"])  # its rows up to the checkpoint must be there
            if problem is None:
                self._restore(state)
                self.results.drop_after(self.run_id, state["round"])
                self.schedule.resume(state["round"])
                return state["round"] + 1
            print(f"{self.server.name}: cannot resume run {state['run_id']} ({problem}); starting a new run",
                  flush=True)
        self.run_id = f"{self.server.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        info = self.run_info
        self.results.start_run(self.run_id, self.server.name, self.dataset_name, self.setting,
                               self.params.model_dump(mode="json", by_alias=True), info.git_revision,
                               experiment=info.experiment, changed=info.changed,
                               label=run_label(self.params, self.server.name), environment=self.environment())
        start = time.perf_counter()
        self.timer.reset()
        with self.timer("exchange"):
            self.sim.setup()  # one-time traffic, counted as round 0
        self.schedule.begin()  # e.g. async: every client's first update starts when the set-up is done
        self._finish_round(SETUP_ROUND, start)
        return 1

    def run_round(self, round_: int) -> None:
        start = time.perf_counter()
        self.timer.reset()
        self.schedule.run(round_, self.timer)  # async: round_ is a span of simulated time
        self._finish_round(round_, start)

    def finish(self) -> dict:
        if self.sim.capture is not None:
            self.sim.capture.save_models(self.clients, self.run_dir)
        self.results.finish_run(self.run_id)
        summary = self.summary()
        self.checkpoint_path.unlink(missing_ok=True)  # the run is complete; its rows are in its results file
        return summary

    def run(self, on_start: Callable[[int], None] | None = None,
            on_round: Callable[[int], None] | None = None) -> dict:
        """The whole run: resume or start, every round, finish; returns the summary. The one loop:
        the training flow calls it too, watching it through `on_start(first_round)` and
        `on_round(round)` (its progress bar)."""
        try:
            first = self.start()
            if on_start is not None:
                on_start(first)
            for round_ in range(first, self.params.train.rounds + 1):
                self.run_round(round_)
                if on_round is not None:
                    on_round(round_)
            return self.finish()
        finally:
            self.close()

    def close(self) -> None:
        """Release what the executor holds (the dask executor's cluster); safe to call twice."""
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    # -- parts -----------------------------------------------------------------------

    def _finish_round(self, round_: int, start: float) -> None:
        t = self.params.train
        timer = self.timer
        rows: list[tuple[int, float, int]] = []
        val_rows: list[tuple[int, float, int]] = []
        extras: dict[str, float] = {}
        if round_ % t.eval_every == 0 or round_ == t.rounds:
            with timer("eval"):
                rows, extras = self.sim.evaluate(round_)
                if any(len(c.y_val) for c in self.clients):  # none without a validation split (val_holdout 0)
                    val_rows, _ = self.sim.evaluate(round_, "val")
        # the mean over clients that have a test sample (a tiny data share can leave one with none: NaN)
        extras.update(self._waiting(round_))
        tested = [a for _, a, n in rows if n > 0]
        mean_acc = float(np.mean(tested)) if tested else None
        validated = [a for _, a, n in val_rows if n > 0]
        if validated:  # the validation split's mean, a round metric (pipeline.results.store reads it as val_acc)
            extras["val_acc"] = float(np.mean(validated))
        val = {k: (a, n) for k, a, n in val_rows}
        rows = [(k, a, n, *val.get(k, (None, 0))) for k, a, n in rows]
        with timer("db"):
            self.server.end_round(round_)
            ledger = self.ledger
            clock = self.sim.clock
            self.results.write_round(self.run_id, round_, mean_acc, ledger.total(round_, UP), ledger.total(round_, DOWN),
                                     time.perf_counter() - start, rows, ledger.timed_rows(round_), extras,
                                     sim_time_s=None if clock is None else clock.now)
        if self.sim.capture is not None:
            with timer("db"):
                self.sim.capture.flush(round_, self.run_dir)
        self.history.append((round_, mean_acc))
        self.val_history.append((round_, extras.get("val_acc")))
        if round_ % t.checkpoint_every == 0 or round_ == t.rounds:
            with timer("checkpoint"):
                checkpoint.save(self.checkpoint_path, self._state(round_))
        for name, seconds in timer.seconds.items():
            self.seconds[name] += seconds
        self.seconds["rounds"] += time.perf_counter() - start

    def _waiting(self, round_: int) -> dict[str, float]:
        """The round's figures for the waiting share (docs/devices.md), as round metrics: sim_busy_s, the
        client-seconds spent on work the server used, and sim_client_s, the client-seconds of the round (its
        participants x its length; async: every client x the span). None without the clock, or for the set-up."""
        if self.sim.clock is None or round_ == SETUP_ROUND:
            return {}
        return self.schedule.waiting()

    def _state(self, round_: int) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "run_id": self.run_id,
            "round": round_,
            "clients": [{"model": c.model.state_dict(), "optimizer": c.optimizer.state_dict(), "state": dict(c.state)}
                        for c in self.clients],
            "algorithm": self.server.state_dict(),
            "ledger": self.ledger.state_dict(),
            "history": list(self.history),
            "val_history": list(self.val_history),
            "torch_rng": torch.get_rng_state(),
            "clock": None if self.sim.clock is None else self.sim.clock.state_dict(),
            "schedule": self.schedule.state_dict(),  # async: the event queue and every client's update in progress
            "dp_noise": None if self.sim.noise is None else self.sim.noise.state_dict(),  # the releases so far
        }

    def _restore(self, state: dict) -> None:
        self.run_id = state["run_id"]
        for c, s in zip(self.clients, state["clients"]):
            c.model.load_state_dict(s["model"])
            c.optimizer.load_state_dict(s["optimizer"])
            c.state = dict(s["state"])
        self.server.load_state_dict(state["algorithm"])
        self.ledger.load_state_dict(state["ledger"])
        self.history = list(state["history"])
        self.val_history = list(state.get("val_history", []))
        torch.set_rng_state(state["torch_rng"])
        if self.sim.clock is not None:
            self.sim.clock.load_state_dict(state["clock"])
        # "async": the key of checkpoints written before the schedules were drivers
        self.schedule.load_state_dict(state.get("schedule", state.get("async", {})))
        if self.sim.noise is not None:
            self.sim.noise.load_state_dict(state.get("dp_noise") or {})

    def summary(self) -> dict:
        evaluated = [(r, a) for r, a in self.history if a is not None]
        ledger = self.ledger
        clock = {} if self.sim.clock is None else {"sim_time_s": round(self.sim.clock.now, 6), **self.schedule.summary()}
        return {
            "run_id": self.run_id,
            "algorithm": self.server.name,
            "dataset": self.dataset_name,
            "setting": self.setting,
            "rounds": self.params.train.rounds,
            "maua": max(a for _, a in evaluated),
            "final_acc": evaluated[-1][1],
            # the validation split's (defaults are chosen on these, never on the test figures above)
            **_val_figures(self.val_history),
            "bytes_total": ledger.total(),
            "bytes_setup": ledger.total() - ledger.total(setup=False),
            "bytes_up": ledger.total(direction=UP),
            "bytes_down": ledger.total(direction=DOWN),
            **clock,  # the run's simulated seconds (devices.enabled)
            # train.dp_noise: the knobs and epsilon at dp_delta (opacus's RDP accountant, pipeline/federation/dp_noise.py)
            **({} if self.sim.noise is None else self.sim.noise.summary()),
            # wall seconds of this process's rounds (set-up round 0 included) and of their parts: where a stage's time goes
            "seconds": {name: round(v, 3) for name, v in sorted(self.seconds.items())},
        }


def _val_figures(val_history: list[tuple[int, float | None]]) -> dict:
    """val_maua and val_final_acc of a run's validation means (None: no validation split)."""
    values = [a for _, a in val_history if a is not None]
    return {"val_maua": max(values) if values else None, "val_final_acc": values[-1] if values else None}
