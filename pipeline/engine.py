"""The round loop shared by every method.

One round, top to bottom (Trainer.run_round):
  1. pick the participating clients (seeded, `train.participation`);
  2. the algorithm trains them locally and does its exchange (algorithms/<name>.py);
  3. every `eval_every` rounds, evaluate *all* clients on their own test split;
  4. write the round to DuckDB (one transaction) and checkpoint it atomically.

Round 0 is set-up: one-time traffic (FedCache's hash upload) and an evaluation of the
initial models. Client state (model, optimizer) persists across rounds. Randomness comes
from named seed streams keyed by (round, client), so a resumed run draws exactly what an
uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.resnet import HETERO_CYCLE, build_model
from pipeline import checkpoint
from pipeline.comm import DOWN, SETUP_ROUND, UP, Ledger
from pipeline.config import Params
from pipeline.data import ImageDataset
from pipeline.devices import resolve_device
from pipeline.partition import Partition
from pipeline.results import ResultsDB
from pipeline.seeds import rng, torch_generator


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 [n,H,W] / [n,H,W,3] -> float [n,C,H,W] scaled to [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(127.5).sub_(1.0)
    return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


@dataclass
class Client:
    id: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    x_train: torch.Tensor
    y_train: torch.Tensor
    ids: torch.Tensor  # global sample ids of the training samples (CPU), travel with each batch
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def model_name(params: Params, client_id: int, hetero: bool) -> str:
    return HETERO_CYCLE[client_id % len(HETERO_CYCLE)] if hetero else params.train.model


def build_clients(params: Params, part: Partition, ds: ImageDataset, device: torch.device,
                  hetero: bool = False) -> list[Client]:
    clients = []
    t = params.train
    for k in range(part.num_clients):
        with torch.random.fork_rng(devices=[]):
            # the same client gets the same initial weights in every algorithm
            torch.manual_seed(int(torch_generator(params.seed, "init", k).initial_seed()))
            model = build_model(model_name(params, k, hetero), ds.channels, ds.num_classes).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        lo, hi = part.train_offsets[k], part.train_offsets[k + 1]
        clients.append(Client(
            id=k, model=model, optimizer=opt,
            x_train=to_tensor(ds.train_x[part.client_train(k)]).to(device),
            y_train=torch.from_numpy(part.train_labels[lo:hi]).to(device),
            ids=torch.arange(lo, hi),
            x_test=to_tensor(ds.test_x[part.client_test(k)]).to(device),
            y_test=torch.from_numpy(part.test_labels[part.test_offsets[k]:part.test_offsets[k + 1]]).to(device),
        ))
    return clients


def batches(client: Client, round_: int, params: Params) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Seeded shuffled batches (x, y, global ids) for one client's local epoch(s); the last partial batch is kept."""
    for epoch in range(params.train.local_epochs):
        order = torch.randperm(client.num_train, generator=torch_generator(params.seed, "batches", round_, client.id, epoch))
        for start in range(0, client.num_train, params.train.batch_size):
            idx = order[start : start + params.train.batch_size]
            dev_idx = idx.to(client.x_train.device)
            yield client.x_train[dev_idx], client.y_train[dev_idx], client.ids[idx]


@torch.inference_mode()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, int]:
    """(accuracy, n) of a model on (x, y), in batches; no partial batch dropped."""
    model.eval()
    correct = 0
    for start in range(0, len(y), batch_size):
        pred = model(x[start : start + batch_size]).argmax(dim=1)
        correct += int((pred == y[start : start + batch_size]).sum())
    return (correct / len(y) if len(y) else float("nan")), len(y)


def evaluate(clients: list[Client], batch_size: int) -> list[tuple[int, float, int]]:
    """(client, accuracy of its own model on its own test split, n_test) for every client."""
    return [(c.id, *evaluate_model(c.model, c.x_test, c.y_test, batch_size)) for c in clients]


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, T: float) -> torch.Tensor:
    """T^2 * KL(softmax(teacher/T) || softmax(student/T)), summed over samples that have a
    teacher (rows without one are NaN) and divided by the batch size."""
    has = ~torch.isnan(teacher[:, 0])
    if not bool(has.any()):
        return student.new_zeros(())
    log_p_student = F.log_softmax(student[has] / T, dim=1)
    log_p_teacher = F.log_softmax(teacher[has] / T, dim=1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum()
    return kl * (T * T) / len(student)


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


@dataclass
class Context:
    """What an algorithm may use: clients, the ledger, params, data layout and where to put files."""

    params: Params
    clients: list[Client]
    ledger: Ledger
    partition: Partition
    device: torch.device
    timer: Timer
    run_dir: Path
    num_classes: int
    hetero: bool = False

    def batches(self, client: Client, round_: int):
        return batches(client, round_, self.params)


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def fingerprint(params: Params, algorithm: str, files: list[Path]) -> str:
    """Identifies a run's inputs; a checkpoint is resumed only when this matches."""
    h = hashlib.sha256(json.dumps({"algorithm": algorithm, "params": params.model_dump(mode="json", by_alias=True)},
                                  sort_keys=True).encode())
    for f in files:
        h.update(Path(f).read_bytes() if Path(f).is_file() else b"-")
    return h.hexdigest()


class Trainer:
    def __init__(self, params: Params, algorithm_cls, part: Partition, ds: ImageDataset, run_dir: Path,
                 checkpoint_path: Path, results: ResultsDB, input_files: list[Path], hetero: bool = False):
        torch.set_num_threads(params.train.threads)
        self.params = params
        self.device = resolve_device(params.device)
        self.results = results
        self.checkpoint_path = Path(checkpoint_path)
        self.dataset_name = ds.name
        run_dir.mkdir(parents=True, exist_ok=True)
        self.hetero = hetero
        self.setting = "hetero" if hetero else "homo"
        self.ctx = Context(params, build_clients(params, part, ds, self.device, hetero), Ledger(), part, self.device,
                           Timer(), run_dir, ds.num_classes, hetero)
        self.algorithm = algorithm_cls(self.ctx)
        self.fingerprint = fingerprint(params, f"{self.algorithm.name}-{self.setting}", input_files)
        self.run_id = ""
        self.history: list[tuple[int, float | None]] = []

    # -- the loop --------------------------------------------------------------------

    def start(self) -> int:
        """Resume from a matching checkpoint, or start a new run with round 0 (set-up). Returns the next round."""
        state = checkpoint.load(self.checkpoint_path)
        if state is not None and state["fingerprint"] == self.fingerprint:
            self._restore(state)
            self.results.drop_after(self.run_id, state["round"])
            return state["round"] + 1
        self.run_id = f"{self.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.results.start_run(self.run_id, self.algorithm.name, self.dataset_name, self.setting,
                               self.params.model_dump(mode="json", by_alias=True), git_revision())
        start = time.perf_counter()
        self.ctx.timer.reset()
        self.algorithm.setup()  # one-time traffic, recorded at round 0
        self._finish_round(SETUP_ROUND, start)
        return 1

    def run_round(self, round_: int) -> None:
        start = time.perf_counter()
        self.ctx.timer.reset()
        with self.ctx.timer("select"):
            selected = self.select_clients(round_)
        self.algorithm.train_round(round_, selected)
        self._finish_round(round_, start)

    def finish(self) -> dict:
        self.results.finish_run(self.run_id)
        summary = self.summary()
        self.checkpoint_path.unlink(missing_ok=True)  # the run is complete; results live in DuckDB
        return summary

    def run(self) -> dict:
        for round_ in range(self.start(), self.params.train.rounds + 1):
            self.run_round(round_)
        return self.finish()

    # -- parts -----------------------------------------------------------------------

    def select_clients(self, round_: int) -> list[int]:
        K = len(self.ctx.clients)
        m = max(1, round(self.params.train.participation * K))
        if m == K:
            return list(range(K))
        return sorted(rng(self.params.seed, "sampling", round_).choice(K, m, replace=False).tolist())

    def _finish_round(self, round_: int, start: float) -> None:
        t = self.params.train
        timer = self.ctx.timer
        rows: list[tuple[int, float, int]] = []
        extras: dict[str, float] = {}
        if round_ % t.eval_every == 0 or round_ == t.rounds:
            with timer("eval"):
                rows, extras = self.algorithm.evaluate(round_)
        mean_acc = float(np.mean([a for _, a, _ in rows])) if rows else None
        with timer("db"):
            self.algorithm.end_round(round_)
            ledger = self.ctx.ledger
            self.results.write_round(self.run_id, round_, mean_acc, ledger.total(round_, UP), ledger.total(round_, DOWN),
                                     time.perf_counter() - start, rows, ledger.rows(round_), extras)
        self.history.append((round_, mean_acc))
        if round_ % t.checkpoint_every == 0 or round_ == t.rounds:
            with timer("checkpoint"):
                checkpoint.save(self.checkpoint_path, self._state(round_))

    def _state(self, round_: int) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "run_id": self.run_id,
            "round": round_,
            "clients": [{"model": c.model.state_dict(), "optimizer": c.optimizer.state_dict()} for c in self.ctx.clients],
            "algorithm": self.algorithm.state_dict(),
            "ledger": self.ctx.ledger.state_dict(),
            "history": list(self.history),
            "torch_rng": torch.get_rng_state(),
        }

    def _restore(self, state: dict) -> None:
        self.run_id = state["run_id"]
        for c, s in zip(self.ctx.clients, state["clients"]):
            c.model.load_state_dict(s["model"])
            c.optimizer.load_state_dict(s["optimizer"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.ctx.ledger.load_state_dict(state["ledger"])
        self.history = list(state["history"])
        torch.set_rng_state(state["torch_rng"])

    def summary(self) -> dict:
        evaluated = [(r, a) for r, a in self.history if a is not None]
        ledger = self.ctx.ledger
        return {
            "run_id": self.run_id,
            "algorithm": self.algorithm.name,
            "dataset": self.dataset_name,
            "setting": self.setting,
            "rounds": self.params.train.rounds,
            "maua": max(a for _, a in evaluated),
            "final_acc": evaluated[-1][1],
            "bytes_total": ledger.total(),
            "bytes_setup": ledger.total() - ledger.total(setup=False),
            "bytes_up": ledger.total(direction=UP),
            "bytes_down": ledger.total(direction=DOWN),
        }
