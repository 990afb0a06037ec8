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

from pipeline.federation.averaging import ParameterAveraging, state_copy
from pipeline.federation.contract import LocalUpdate, Upload
from pipeline.federation.clients import Context, evaluate_model
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


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
