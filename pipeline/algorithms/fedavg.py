"""FedAvg: full model parameters down and up every round, averaged weighted by sample counts.

Homogeneous models only (a config error otherwise). Each selected client loads the global
model, trains one local epoch (a fresh optimizer state each round, as in FedAvg), and uploads
its parameters and buffers; the server's new global model is the sample-count-weighted mean.

Accuracy reading (`fedavg.eval_model`, recorded with the run): `personalized` (default)
evaluates each client's own model after its local training, the personalized reading that
matches how the other methods are measured; `global` evaluates the global model on each
client's test split. The other reading is stored too, as round metric `acc_global` /
`acc_personalized`.

Bytes per selected client and round: the nbytes of every state_dict tensor, down and up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.algorithms.base import Algorithm
from pipeline.comm import DOWN, UP, Payload
from pipeline.engine import Context, evaluate_model


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Per-tensor weighted mean; integer buffers (BatchNorm's step counter) are rounded back."""
    total = float(sum(weights))
    out = {}
    for name, first in states[0].items():
        acc = sum(s[name].double() * (w / total) for s, w in zip(states, weights))
        out[name] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


class FedAvg(Algorithm):
    name = "fedavg"
    homogeneous_only = True

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.eval_model = ctx.params.fedavg.eval_model
        # the global model starts as client 0's initial weights
        self.global_state = {n: t.detach().cpu().clone() for n, t in ctx.clients[0].model.state_dict().items()}
        self.global_model = None  # built lazily for the `global` reading

    def train_round(self, round_: int, selected: list[int]) -> None:
        states, weights = [], []
        for k in selected:
            client = self.ctx.clients[k]
            with self.ctx.timer("exchange"):
                down = self.ctx.ledger.record(round_, k, DOWN, Payload("params", dict(self.global_state)))
                client.model.load_state_dict(down.arrays)
                client.optimizer.state.clear()
            client.model.train()
            for x, y, _ in self.ctx.batches(client, round_):
                client.step(F.cross_entropy(client.model(x), y))
            with self.ctx.timer("exchange"):
                up = self.ctx.ledger.record(round_, k, UP, Payload(
                    "params", {n: t.detach().cpu().clone() for n, t in client.model.state_dict().items()}))
                states.append(up.arrays)
                weights.append(client.num_train)
        with self.ctx.timer("exchange"):
            self.global_state = weighted_average(states, weights)

    def evaluate(self, round_: int):
        personalized = super().evaluate(round_)[0]
        model = self._global_model()
        global_rows = [(c.id, *evaluate_model(model, c.x_test, c.y_test, self.ctx.params.train.eval_batch_size))
                       for c in self.ctx.clients]
        mean = lambda rows: sum(a for _, a, _ in rows) / len(rows)  # noqa: E731
        if self.eval_model == "personalized":
            return personalized, {"acc_global": mean(global_rows)}
        return global_rows, {"acc_personalized": mean(personalized)}

    def _global_model(self):
        if self.global_model is None:
            import copy

            self.global_model = copy.deepcopy(self.ctx.clients[0].model)
        self.global_model.load_state_dict(self.global_state)
        return self.global_model

    def state_dict(self) -> dict:
        return {"global": {n: t.clone() for n, t in self.global_state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}
