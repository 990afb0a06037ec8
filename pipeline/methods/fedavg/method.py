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

import copy

import torch

from pipeline.federation.contract import LocalUpdate, Method, Upload
from pipeline.federation.clients import Context, evaluate_model
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Per-tensor weighted mean; integer buffers (BatchNorm's step counter) are rounded back."""
    total = float(sum(weights))
    out = {}
    for name, first in states[0].items():
        acc = sum(s[name].double() * (w / total) for s, w in zip(states, weights))
        out[name] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


def state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in model.state_dict().items()}


class FedAvgClient(LocalUpdate):
    def begin(self, client, download, round_):
        (params,) = download
        client.model.load_state_dict(params.arrays)
        client.optimizer.state.clear()  # FedAvg: a fresh optimizer state from the global model each round
        return {}

    def loss(self, model, step, phase):
        return ce_rows(model(step.x), step.y)

    def end(self, client, targets, records, round_):
        return Upload([Payload("params", state_copy(client.model))], {"weight": float(client.num_train)})


class ParameterAveraging(Method):
    """The server half of the parameter-averaging methods (FedAvg, MTFL, pFedMe): one global state
    sent to every selected client, replaced by the sample-weighted mean of what they upload."""

    homogeneous_only = True

    def __init__(self, ctx: Context, global_state: dict[str, torch.Tensor]):
        super().__init__(ctx)
        self.global_state = global_state

    def configure(self, round_, selected):
        return {k: [Payload("params", dict(self.global_state))] for k in selected}

    def mean_upload(self, uploads) -> dict[str, torch.Tensor]:
        ups = list(uploads.values())
        return weighted_average([u.payloads[0].arrays for u in ups], [u.kept["weight"] for u in ups])

    def aggregate(self, round_, uploads):
        self.global_state = self.mean_upload(uploads)

    def state_dict(self) -> dict:
        return {"global": {n: t.clone() for n, t in self.global_state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}


class FedAvg(ParameterAveraging):
    name = "fedavg"
    client_cls = FedAvgClient

    def __init__(self, ctx: Context):
        # the global model starts as client 0's initial weights
        super().__init__(ctx, state_copy(ctx.clients[0].model))
        self.eval_model = ctx.params.fedavg.eval_model
        self.global_model = None  # built lazily for the `global` reading

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
            self.global_model = copy.deepcopy(self.ctx.clients[0].model)
        self.global_model.load_state_dict(self.global_state)
        return self.global_model
