"""FedAvg: full model parameters down and up every round, averaged weighted by sample counts.

Homogeneous models only (a config error otherwise). Each selected client loads the global
model, trains one local epoch (a fresh optimizer state each round, as in FedAvg), and uploads
its parameters and buffers; the server's new global model is the sample-count-weighted mean.

Accuracy reading (`fedavg.eval_model`, recorded with the run): `personalized` (default)
evaluates each client's own model after its local training, the personalized reading that
matches how the other methods are measured; `global` evaluates the global model on each
client's test split. The other reading is stored too, as round metric `acc_global` /
`acc_personalized`.

Bytes per selected client and round: the nbytes of every state_dict tensor, down and up; with `fedavg.encode_down`
/ `encode_up` (float16, int8 per tensor row: pipeline/federation/averaging.py) the global state travels encoded
down and each client's change to it up; up also topk:F (the fraction F of each tensor's entries, the largest in
magnitude, with error feedback: what a client leaves out it adds to its next change).
"""

from __future__ import annotations

from pipeline.federation.averaging import ParameterAveraging, receive_state, state_codes, state_copy, state_payload
from pipeline.federation.clients import evaluate_model, evaluate_with
from pipeline.federation.contract import Evaluation, LocalUpdate, ServerContext, Upload, sample_count
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


class FedAvgClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.codes = state_codes(params, "fedavg")  # (encode_down, encode_up)

    def begin(self, client, download, round_):
        (params,) = download
        client.model.load_state_dict(receive_state(client, params, self.codes, state_copy(client.model)))
        client.optimizer.state.clear()  # FedAvg: a fresh optimizer state from the global model each round
        return {}

    def loss(self, model, step, phase):
        return ce_rows(model(step.x), step.y)

    def end(self, client, targets, records, round_):
        return Upload([state_payload(client, state_copy(client.model), self.codes[1]), sample_count(client.num_train)])

    def evaluate(self, client, download):
        """Both readings: the client's own model, and the global model (the evaluation download)."""
        bs = self.params.train.eval_batch_size
        personalized, n = evaluate_model(client.model, client.x_test, client.y_test, bs)
        (global_params,) = download
        return Evaluation(n, {"personalized": personalized, "global": evaluate_with(client, global_params.arrays, bs)})


class FedAvg(ParameterAveraging):
    name = "fedavg"
    client_cls = FedAvgClient

    def __init__(self, ctx: ServerContext):
        # the global model starts as client 0's initial weights
        super().__init__(ctx, state_copy(ctx.initial_model(0)))
        self.eval_model = ctx.params.fedavg.eval_model

    def evaluation(self, round_):
        return [Payload("params", self.global_state)]

    def report(self, round_, evaluations):
        rows = {name: [(k, e.acc[name], e.n) for k, e in sorted(evaluations.items())]
                for name in ("personalized", "global")}
        mean = lambda rows: sum(a for _, a, _ in rows) / len(rows)  # noqa: E731
        if self.eval_model == "personalized":
            return rows["personalized"], {"acc_global": mean(rows["global"])}
        return rows["global"], {"acc_personalized": mean(rows["personalized"])}
