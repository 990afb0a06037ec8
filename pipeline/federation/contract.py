"""The client/server contract every method implements (one folder per method, pipeline/methods/<name>/).

A method is two halves that talk only through payloads (pipeline/federation/ledger.py):

  server half (`Server`): turns the round-start state into one download per selected client
      (`configure`) and folds the clients' uploads back into its state (`aggregate`). It gets a
      `ServerContext`: params, the data layout and a folder, never a client, model or optimizer.
      What it learns about a client arrives as an upload (set-up, round or per-step);
  client half (`LocalUpdate`): a function of (client state, download, round) that trains the
      client locally and returns its upload, touching nothing shared. It is written as a
      per-step loss over *rows* (samples), so an executor (pipeline/train/executors.py) can run it
      one client at a time or for many clients in one batched step. Its other client tasks:
      `prepare` (shape the client's model once), `setup` (the one-time round-0 upload) and
      `evaluate` (the client's accuracies on its own test split), all run by the engine's executor.

The engine owns the boundary: it records every payload in the byte ledger there, so a method
never calls the ledger itself. FedCache's per-batch exchange (`live` / `step` consistency) is
the one sanctioned exception to "download, train, upload": a per-step hook (`exchange`) the
executor calls with the step's uploads; the engine's ledger counts those payloads as well.
Evaluation inputs (`Server.evaluation`, e.g. FedAvg's global model) are a measurement of the
simulation, not traffic of the method, so they are not counted.

Each method declares itself once, here: its name (also its params.yaml section) and the input
files its checkpoint fingerprint covers; what it supports (executors, schedules, heterogeneous
runs) its params class declares (`supports`, pipeline/capabilities.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from pipeline.data.partition import Partition
from pipeline.federation.clients import Client, evaluate_model, initial_model
from pipeline.federation.ledger import Payload

if TYPE_CHECKING:
    from pipeline.config import Params


@dataclass(frozen=True)
class Phase:
    """One pass (train.local_epochs epochs) of local training.

    `stream` picks the seeded batch order (stream 0 is the order every method's first pass
    uses); `trainable` says which parameters (by name) this pass updates (None: all); `repeat`
    takes each batch that many times in a row (pFedMe's inner solver: K steps on one batch).
    """

    stream: int = 0
    trainable: Callable[[str], bool] | None = None
    name: str = "train"
    repeat: int = 1


@dataclass
class Upload:
    """What a client returns at the end of its update; every field is typed, nothing travels beside them.

    payloads: sent to the server, counted by the engine when they arrive;
    relay: sent to other clients (decentralized methods): the network simulator (the method's server half)
        holds them and delivers them as payloads with `sender` set, each counted on its edge when delivered;
    metrics: the client's diagnostics for the round's report (plain numbers, e.g. pDFL's teacher accuracies):
        a measurement of the simulation, not traffic of the method (as an Evaluation), so not counted."""

    payloads: list[Payload] = field(default_factory=list)
    relay: list[Payload] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in self.metrics.items():
            if type(value) is not float:  # an array here would be traffic nobody counts
                raise TypeError(f"Upload.metrics[{name!r}] is a {type(value).__name__}: metrics are plain floats; "
                                "send arrays as payloads (or relay), which the ledger counts")

    def payload(self, kind: str) -> Payload:
        """The one payload of `kind` this upload carries."""
        found = [p for p in self.payloads if p.kind == kind]
        if len(found) != 1:
            raise KeyError(f"the upload carries {len(found)} payloads of kind {kind!r} (kinds: "
                           f"{[p.kind for p in self.payloads]})")
        return found[0]


SAMPLE_COUNT = "num_samples"


def sample_count(n: int) -> Payload:
    """A client's training-sample count, what a sample-weighted mean weighs its upload by: one int32, counted."""
    return Payload(SAMPLE_COUNT, {SAMPLE_COUNT: torch.tensor([n], dtype=torch.int32)})


def weight_of(upload: Upload) -> float:
    """The sample count an upload carries (`sample_count`), as a weight."""
    return float(upload.payload(SAMPLE_COUNT).arrays[SAMPLE_COUNT][0])


@dataclass(frozen=True)
class Evaluation:
    """One client's evaluation on its own test split: its size and named accuracies
    ("acc": the client's own model; a method may add others, e.g. FedAvg's "global")."""

    n: int
    acc: dict[str, float]


@dataclass
class ServerContext:
    """What a method's server half may use: params, the data layout, where to put files. No
    clients, models or optimizers: the server learns about a client only from its uploads.

    `partition` is the layout the simulation was built from: which sample ids (and labels) each
    client holds, never the samples. FedCache's clients announce their ids and labels in their
    set-up upload; FD's server sends a client the teachers of the classes it holds, which a
    deployment would have the client announce (C bits, not counted)."""

    params: Params
    num_clients: int
    num_classes: int
    input_shape: tuple[int, int, int]  # one sample as a model sees it: (channels, height, width)
    partition: Partition
    device: torch.device
    run_dir: Path
    hetero: bool = False

    @property
    def in_channels(self) -> int:
        return self.input_shape[0]

    def _span(self, k: int) -> tuple[int, int]:
        return int(self.partition.train_offsets[k]), int(self.partition.train_offsets[k + 1])

    def client_sample_ids(self, k: int) -> torch.Tensor:
        """The global ids of client k's training samples (what its uploads name samples by)."""
        return torch.arange(*self._span(k))

    def client_labels(self, k: int) -> torch.Tensor:
        """The labels of client k's training samples."""
        lo, hi = self._span(k)
        return torch.from_numpy(self.partition.train_labels[lo:hi])

    def initial_model(self, k: int = 0) -> nn.Module:
        """A new copy of the model client k starts from (same seed stream): how a server
        initialises a global model, or learns an architecture's sizes, without a client."""
        return initial_model(self.params, k, self.hetero, self.in_channels, self.num_classes, self.device)


@dataclass(frozen=True)
class Wire:
    """A method's declared size of one kind of payload in one round: `count` units of `unit` bytes
    (exactly; or between 1 and `count` when not `exact`, e.g. FD's teachers exist only for the
    classes another client holds). Arrays as they travel in float32 (the default dtype)."""

    unit: int
    count: int = 1
    exact: bool = True


def state_bytes(state: dict[str, torch.Tensor] | nn.Module) -> int:
    """What a state_dict (or a module's) weighs on the wire: the nbytes of every tensor."""
    if isinstance(state, nn.Module):
        state = state.state_dict()
    return sum(t.numel() * t.element_size() for t in state.values())


@dataclass
class Step:
    """One local step as the client half sees it: rows of one or several clients.

    x, y, ids: the step's samples (rows) and their global sample ids (CPU); t: per-sample targets the client prepared in `begin`,
    gathered for these rows; `exchange(payload)` sends a payload of per-row arrays through
    the per-step hook and returns the answer's arrays, row for row; `record(name, rows)` keeps per-row values for `end` (e.g. FD's logits).
    """

    x: torch.Tensor
    y: torch.Tensor
    ids: torch.Tensor
    t: dict[str, torch.Tensor]
    exchange: Callable[[Payload], dict[str, torch.Tensor]]
    record: Callable[[str, torch.Tensor], None]


class LocalUpdate:
    """The client half. Subclasses define `loss`; most also `begin` and `end`."""

    uses_exchange = False  # True: `loss` calls step.exchange (a per-step server hook)

    def __init__(self, params: Params, num_classes: int):
        self.params = params
        self.num_classes = num_classes

    def prepare(self, client: Client) -> None:
        """Once, when the client is built (a checkpoint is restored after it): shape its model
        (FedAlt's multi-exit network, FedProto's adapter). Must be deterministic (seeded)."""

    def setup(self, client: Client) -> Upload:
        """Round 0: the client's one-time upload (FedCache's hash codes), counted as set-up traffic."""
        return Upload()

    def phases(self, round_: int) -> list[Phase]:
        return [Phase()]

    def extra_samples(self, client: Client, upload: Upload, round_: int) -> int:
        """Samples (of the client's own architecture) the client trained in the round besides its phases, e.g.
        pDFL's peer copies: the simulated clock times them with the phases'. Default: none."""
        return 0

    def begin(self, client: Client, download: list[Payload], round_: int) -> dict[str, torch.Tensor]:
        """Apply the download to the client; return per-sample targets [n_k, ...] (on its device)."""
        return {}

    def loss(self, model, step: Step, phase: Phase) -> torch.Tensor:
        """The per-row loss [rows]; the executor sums each client's rows and divides by its batch size."""
        raise NotImplementedError

    def end(self, client: Client, targets: dict[str, torch.Tensor], records: dict[str, tuple[torch.Tensor, torch.Tensor]],
            round_: int) -> Upload:
        """After local training: the upload. records[name] = (local sample indices, rows) in visit order."""
        return Upload()

    def end_all(self, finished: list[tuple[Client, dict[str, torch.Tensor], dict]], round_: int) -> dict[int, Upload]:
        """`end` for every client of a round at once, (client, targets, records) each; the vectorized
        executor calls this, so a method whose `end` trains models (pDFL's peer copies) can batch them.
        Must give what `end` gives one client after another (the conformance suite checks it)."""
        return {client.id: self.end(client, targets, records, round_) for client, targets, records in finished}

    def evaluate(self, client: Client, download: list[Payload]) -> Evaluation:
        """The client's accuracies on its own test split; `download` is `Server.evaluation`'s."""
        acc, n = evaluate_model(client.model, client.x_test, client.y_test, self.params.train.eval_batch_size)
        return Evaluation(n, {"acc": acc})


class Server:
    """The server half, plus the method's declaration."""

    name = "base"  # its folder, pipeline/methods/<name>/, and its params.yaml section
    client_cls: type[LocalUpdate] = LocalUpdate

    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    # -- declaration -------------------------------------------------------------------

    @classmethod
    def inputs(cls) -> list[Path]:
        """Files the run's checkpoint fingerprint covers (a resumed run needs the same inputs)."""
        from pipeline import paths

        return [paths.PARTITION]

    # -- server half ---------------------------------------------------------------------

    def wire(self, k: int) -> dict[tuple[str, str], Wire]:
        """The byte formula of everything client k sends ("up") or receives ("down") in a round, by
        (direction, kind); for a payload between clients, k is the sender. The conformance suite
        checks every row of the ledger against it. Default: nothing travels."""
        return {}

    def setup(self, uploads: dict[int, Upload]) -> None:
        """Round 0: take every client's one-time upload (`LocalUpdate.setup`; the engine counted it)."""

    def configure(self, round_: int, selected: list[int]) -> dict[int, list[Payload]]:
        """The download of every selected client, from the round-start state."""
        return {k: [] for k in selected}

    def exchange(self, round_: int, uploads: dict[int, Payload]) -> dict[int, Payload]:
        """Per-step hook (only for clients with uses_exchange): uploads of one step -> downloads."""
        raise NotImplementedError(f"{self.name} has no per-step exchange")

    def end_step(self) -> None:
        """Called by the executor after every client took the current local step."""

    def aggregate(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Fold the selected clients' uploads into the server's state."""

    def arrive(self, round_: int, k: int, upload: Upload) -> None:
        """`train.schedule: async`: fold client k's upload in as it arrives (`round_`: the evaluation span it
        arrives in). Default: `aggregate` with that one upload (right for a method whose server keeps each
        client's latest upload, FedCache's cache, FD's class logits)."""
        self.aggregate(round_, {k: upload})

    def evaluation(self, round_: int) -> list[Payload]:
        """What every client evaluates with besides its own model (e.g. FedAvg's global model)."""
        return []

    def count_work(self, flops: float) -> None:
        """Note floating-point operations the server half computed (making downloads and per-step answers, folding
        uploads in, training a server model): the simulated clock times them (`take_work`, docs/devices.md)."""
        self._work = getattr(self, "_work", 0.0) + float(flops)

    def take_work(self) -> float:
        """The FLOPs noted since the last call; the engine takes a round's after its aggregation."""
        work, self._work = getattr(self, "_work", 0.0), 0.0
        return work

    def final_downloads(self, round_: int) -> dict[int, list[Payload]]:
        """After the last round (`round_`): what the server sends each client for the last evaluation to read,
        where that evaluation reads what a download brings and no next round's download will (MTFL's
        before_local). The engine counts it as the last round's download traffic (and times it with the clock).
        Default: nothing."""
        return {}

    def report(self, round_: int, evaluations: dict[int, Evaluation]
               ) -> tuple[list[tuple[int, float, int]], dict[str, float]]:
        """The round's figures from every client's evaluation: (client, acc, n_test) rows, plus named
        extra round metrics (another accuracy reading, server-side diagnostics). Default: "acc"."""
        return [(k, e.acc["acc"], e.n) for k, e in sorted(evaluations.items())], {}

    def end_round(self, round_: int) -> None:
        """After training and evaluation: persist what the method keeps at rest."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
