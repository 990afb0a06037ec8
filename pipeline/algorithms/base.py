"""The small interface every method implements (one module per method, one registry line)."""

from __future__ import annotations

from pipeline.config import ConfigError
from pipeline.engine import Context, evaluate


class Algorithm:
    name = "base"
    # True for methods that average model parameters: they need one architecture on every client
    homogeneous_only = False

    def __init__(self, ctx: Context):
        if self.homogeneous_only and ctx.hetero:
            raise ConfigError(f"{self.name} averages model parameters, so it needs the same model on every client: "
                              "remove it from train.hetero_algorithms")
        self.ctx = ctx

    def setup(self) -> None:
        """Round 0: one-time traffic (recorded in the ledger at round 0)."""

    def train_round(self, round_: int, selected: list[int]) -> None:
        """Local training of the selected clients plus this method's exchange."""
        raise NotImplementedError

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
