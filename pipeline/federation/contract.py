"""The client/server contract every method implements (one module per method, one registry line).

A method is two halves that talk only through payloads (pipeline/federation/ledger.py):

  server half (`Method`): turns the round-start state into one download per selected client
      (`configure`) and folds the clients' uploads back into its state (`aggregate`);
  client half (`LocalUpdate`): a function of (client state, download, round) that trains the
      client locally and returns its upload, touching nothing shared. It is written as a
      per-step loss over *rows* (samples), so an executor (pipeline/train/executors.py) can run it
      one client at a time or for many clients in one batched step.

The engine owns the boundary: it records every payload in the byte ledger there, so a method
never calls the ledger itself. FedCache's per-batch exchange (`live` / `step` consistency) is
the one sanctioned exception to "download, train, upload": a per-step hook (`exchange`) the
executor calls with the step's uploads; the engine's ledger counts those payloads as well.

Each method declares itself once, here: its name (also its params.yaml section), whether it
needs one architecture on every client, the input files its checkpoint fingerprint covers,
and whether the vectorized executor can run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

from pipeline.federation.ledger import Payload
from pipeline.errors import ConfigError
from pipeline.federation.clients import Client, Context, evaluate

if TYPE_CHECKING:
    from pipeline.config import Params


@dataclass(frozen=True)
class Phase:
    """One pass (train.local_epochs epochs) of local training.

    `stream` picks the seeded batch order (stream 0 is the order every method's first pass
    uses); `trainable` says which parameters (by name) this pass updates (None: all).
    """

    stream: int = 0
    trainable: Callable[[str], bool] | None = None
    name: str = "train"


@dataclass
class Upload:
    """What a client returns: the payloads it sends (counted by the engine) and what it keeps
    for itself but the simulation reads (e.g. pDFL's published knowledge; never counted)."""

    payloads: list[Payload] = field(default_factory=list)
    kept: dict = field(default_factory=dict)


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

    def phases(self, round_: int) -> list[Phase]:
        return [Phase()]

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


class Method:
    """The server half, plus the method's declaration."""

    name = "base"  # its folder, pipeline/methods/<name>/, and its params.yaml section
    client_cls: type[LocalUpdate] = LocalUpdate

    def __init__(self, ctx: Context):
        # homogeneous_only is declared by the method's params class (params.py), which the
        # params schema reads without importing method code
        if getattr(getattr(ctx.params, self.name, None), "homogeneous_only", False) and ctx.hetero:
            raise ConfigError(f"{self.name} averages model parameters, so it needs the same model on every client: "
                              "remove it from train.hetero_algorithms")
        self.ctx = ctx
        self.client = self.client_cls(ctx.params, ctx.num_classes)

    # -- declaration -------------------------------------------------------------------

    @classmethod
    def inputs(cls) -> list[Path]:
        """Files the run's checkpoint fingerprint covers (a resumed run needs the same inputs)."""
        from pipeline import paths

        return [paths.PARTITION]

    @classmethod
    def vectorized_unsupported(cls, params: Params) -> str | None:
        """Why the vectorized executor cannot run this method with these params (None: it can)."""
        return None

    # -- server half ---------------------------------------------------------------------

    def setup(self) -> dict[int, list[Payload]]:
        """Round 0: one-time uploads per client (the engine records them as round-0 traffic)."""
        return {}

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

    def evaluate(self, round_: int) -> tuple[list[tuple[int, float, int]], dict[str, float]]:
        """Every client on its own test split: (client, acc, n_test) rows for the round figure,
        plus named extra round metrics (e.g. another accuracy reading). Default: each client's model."""
        return evaluate(self.ctx.clients, self.ctx.params.train.eval_batch_size), {}

    def end_round(self, round_: int) -> None:
        """After training and evaluation: persist what the method keeps at rest."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
