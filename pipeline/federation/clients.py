"""Client state and the data each client holds: what a method's client half works on.

A Client is one user's device: its model, its optimizer state, its own training and test
samples (with their global sample ids) and a small dict of method-specific state that lives
on the client (e.g. FedProto's copy of the server's reconstruction of its uploads). It is
everything that would travel if the client trained elsewhere.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from models.resnet import HETERO_CYCLE, build_model
from pipeline.data.datasets import ImageDataset
from pipeline.data.partition import Partition
from pipeline.seeds import torch_generator

if TYPE_CHECKING:  # the training core runs without the config library (bench/gpu_check.sh)
    from pipeline.config import Params


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
    x_test: torch.Tensor  # the split every evaluation reads (`on_split` points it at the validation split)
    y_test: torch.Tensor
    x_val: torch.Tensor  # the validation split: defaults are tuned on it (docs/choices.md)
    y_val: torch.Tensor
    state: dict[str, object] = field(default_factory=dict)  # method-specific state kept on the client (tensors)

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def new_optimizer(self) -> None:
        """A fresh SGD over the model's current parameters (after a method replaced the model)."""
        old = self.optimizer.defaults
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=old["lr"], momentum=old["momentum"],
                                         weight_decay=old["weight_decay"])


def model_name(params: Params, client_id: int, hetero: bool) -> str:
    return HETERO_CYCLE[client_id % len(HETERO_CYCLE)] if hetero else params.train.model


def initial_model(params: Params, k: int, hetero: bool, in_channels: int, num_classes: int,
                  device: torch.device) -> nn.Module:
    """Client k's initial model: the same weights in every method, whoever builds it (the global
    random state is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch_generator(params.seed, "init", k).initial_seed()))
        return build_model(model_name(params, k, hetero), in_channels, num_classes).to(device)


def build_clients(params: Params, part: Partition, ds: ImageDataset, device: torch.device,
                  hetero: bool = False) -> list[Client]:
    clients = []
    t = params.train
    for k in range(part.num_clients):
        model = initial_model(params, k, hetero, ds.channels, ds.num_classes, device)
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        lo, hi = part.train_offsets[k], part.train_offsets[k + 1]
        clients.append(Client(
            id=k, model=model, optimizer=opt,
            x_train=to_tensor(ds.train_x[part.client_train(k)]).to(device),
            y_train=torch.from_numpy(part.train_labels[lo:hi]).to(device),
            ids=torch.arange(lo, hi),
            x_test=to_tensor(ds.test_x[part.client_test(k)]).to(device),
            y_test=torch.from_numpy(part.test_labels[part.test_offsets[k]:part.test_offsets[k + 1]]).to(device),
            x_val=to_tensor(ds.train_x[part.client_val(k)]).to(device),
            y_val=torch.from_numpy(part.val_labels[part.val_offsets[k]:part.val_offsets[k + 1]]).to(device),
        ))
    return clients


@contextmanager
def on_split(clients: list[Client], split: str):
    """Every evaluation reads a client's x_test / y_test; within this block they are its `split`
    ("test" or "val"), so each method's own evaluation code runs unchanged on the validation split."""
    if split == "test":
        yield
        return
    saved = [(c.x_test, c.y_test) for c in clients]
    for c in clients:
        c.x_test, c.y_test = c.x_val, c.y_val
    try:
        yield
    finally:
        for c, (x, y) in zip(clients, saved):
            c.x_test, c.y_test = x, y


def batch_order(client: Client, round_: int, params: Params, stream: int = 0) -> list[torch.Tensor]:
    """The local sample indices of each of a client's batches in one pass (train.local_epochs
    epochs), seeded by (round, client, pass): nothing depends on loader or executor order.

    No sample is dropped: when the batch size does not divide the client's samples, the
    epoch's *first* batch is the partial one. Then every client's partial batch falls on the
    same step of the vectorized executor (the only step that needs masked statistics), rather
    than on a different last step for each client size."""
    t = params.train
    n, b = client.num_train, t.batch_size
    sizes = ([n % b] if n % b else []) + [b] * (n // b)
    out = []
    for epoch in range(t.local_epochs):
        gen = torch_generator(params.seed, "batches", round_, client.id, stream * t.local_epochs + epoch)
        out += list(torch.split(torch.randperm(n, generator=gen), sizes))
    return out


def phase_batches(client: Client, round_: int, params: Params, stream: int = 0, repeat: int = 1) -> list[torch.Tensor]:
    """A pass's batches as the executors step them: `batch_order`, each batch `repeat` times in a row."""
    return [idx for idx in batch_order(client, round_, params, stream) for _ in range(repeat)]


@torch.inference_mode()
def evaluate_with(client: "Client", state: dict[str, torch.Tensor], batch_size: int, strict: bool = True) -> float:
    """Accuracy on the client's test split of its model with `state` in place of its own tensors (strict=False: only
    the tensors `state` names, e.g. shared layers over the client's own BatchNorm), checked as `load_state_dict`
    checks it; the client's tensors are untouched. The model runs on the substituted tensors through
    torch.func.functional_call: copying the module instead cost about 16 ms an evaluation."""
    own = client.model.state_dict()
    unknown = sorted(state.keys() - own.keys())
    missing = sorted(own.keys() - state.keys()) if strict else []
    wrong = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    if unknown or missing or wrong:
        raise RuntimeError(f"evaluate_with: the state does not fit client {client.id}'s model: unexpected {unknown}, "
                           f"missing {missing}, of another shape {wrong}")
    # load_state_dict would copy into the model's own dtypes: so does this (float64 tests, float32 payloads)
    tensors = {**own, **{k: v.to(own[k].dtype) for k, v in state.items()}}
    return evaluate_model(client.model, client.x_test, client.y_test, batch_size, tensors)[0]


# no autograd graph (inference_mode: nor version counters; measured alike with no_grad, bench/eval_speed.py)
@torch.inference_mode()
def evaluate_model(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int,
                   tensors: dict[str, torch.Tensor] | None = None) -> tuple[float, int]:
    """(accuracy, n) of a model on (x, y), in batches; no partial batch dropped. tensors: the model's parameters and
    buffers to run it on instead of its own (torch.func.functional_call). The model is left in eval mode, unless
    given tensors: then its mode is restored."""
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(y), batch_size):
            batch = x[start : start + batch_size]
            logits = model(batch) if tensors is None else torch.func.functional_call(model, tensors, (batch,))
            correct += int((logits.argmax(dim=1) == y[start : start + batch_size]).sum())
    finally:
        if tensors is not None:
            model.train(was_training)
    return (correct / len(y) if len(y) else float("nan")), len(y)
