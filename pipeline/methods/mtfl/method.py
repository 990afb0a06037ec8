"""MTFL: FedAvg with private BatchNorm layers (federated multi-task learning, Mills et al.).

Every BatchNorm layer of a client's model (its weight and bias, and its running statistics)
stays on the client: those layers are what makes each model the client's own task. Every other
tensor is shared as in FedAvg (the FedCache paper runs MTFL "with the FedAvg optimisation
strategy"): each selected client loads the global shared tensors into its model, keeping its own
BatchNorm, trains one local epoch with a fresh optimizer state, and uploads its shared tensors;
the server's new shared tensors are their sample-count-weighted mean.

Evaluation, as MTFL defines a user's accuracy (`mtfl.eval: before_local`, the default): the new
global shared tensors with the client's own private BatchNorm (its parameters and running
statistics), before any local training on them: what a user gets from a download. The other
reading, `after_local` (the client's model as its local training left it), is kept as a round
metric (`acc_after_local`, or `acc_before_local` when after_local is the figure).

Homogeneous models only (a config error otherwise). Bytes per selected client and round: the
nbytes of every shared tensor, down and up (the BatchNorm tensors never travel). With before_local,
the last round's figure reads shared tensors that no next round's download brings: after the last
round the server sends them to every client (kind `final_params`, counted in the last round).
"""

from __future__ import annotations

import torch

from pipeline.federation.clients import evaluate_model, evaluate_with
from pipeline.federation.contract import Evaluation, LocalUpdate, ServerContext, Upload, sample_count
from pipeline.federation.averaging import ParameterAveraging, encode_state, receive_state, state_codes, state_payload
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


def private_names(model: torch.nn.Module) -> set[str]:
    """The state_dict names of every BatchNorm layer's tensors (parameters and buffers)."""
    layers = [name for name, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    return {f"{layer}.{t}" for layer in layers for t in dict(model.get_submodule(layer).state_dict())}


def shared_state(model: torch.nn.Module, private: set[str]) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in model.state_dict().items() if n not in private}


class MTFLClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.codes = state_codes(params, "mtfl")  # (encode_down, encode_up)

    def begin(self, client, download, round_):
        (shared,) = download
        template = shared_state(client.model, private_names(client.model))
        # the BatchNorm tensors stay the client's
        client.model.load_state_dict(receive_state(client, shared, self.codes, template), strict=False)
        client.optimizer.state.clear()  # the FedAvg optimisation strategy: a fresh optimizer state each round
        return {}

    def loss(self, model, step, phase):
        return ce_rows(model(step.x), step.y)

    def end(self, client, targets, records, round_):
        shared = shared_state(client.model, private_names(client.model))
        return Upload([state_payload(client, shared, self.codes[1]), sample_count(client.num_train)])

    def evaluate(self, client, download):
        """Both readings: before_local (the global shared tensors, the evaluation download, in a copy of
        the client's model: its BatchNorm stays) and after_local (the client's model as it is)."""
        bs = self.params.train.eval_batch_size
        after, n = evaluate_model(client.model, client.x_test, client.y_test, bs)
        (shared,) = download  # shared tensors only: the BatchNorm stays the client's
        return Evaluation(n, {"before_local": evaluate_with(client, shared.arrays, bs, strict=False), "after_local": after})


class MTFL(ParameterAveraging):
    name = "mtfl"
    client_cls = MTFLClient

    def __init__(self, ctx: ServerContext):
        model = ctx.initial_model(0)
        private = private_names(model)
        if not private:
            raise ValueError(f"mtfl keeps the BatchNorm layers private, but {type(model).__name__} has none")
        super().__init__(ctx, shared_state(model, private))  # starts as client 0's initial shared weights
        self.private = private
        self.eval_reading = ctx.params.mtfl.eval

    def wire(self, k):
        wire = super().wire(k)
        if self._sends_final():
            wire[("down", "final_params")] = wire[("down", "params")]
        return wire

    def _sends_final(self) -> bool:
        # async has no last round (its spans' readings are a separate question: docs/devices.md)
        return self.eval_reading == "before_local" and not self.asynchronous

    def evaluation(self, round_):
        return [Payload("params", self.global_state)]

    def final_downloads(self, round_):
        """before_local: the last figure is each client's own BatchNorm with the new global shared tensors, which
        the clients have only once they download them: after the last round the server sends them to all."""
        if not self._sends_final():
            return {}
        parts = dict(self.global_state) if self.down.lossless else encode_state(self.down, self.global_state)[0]
        return {k: [Payload("final_params", parts)] for k in range(self.ctx.num_clients)}

    def report(self, round_, evaluations):
        other = "after_local" if self.eval_reading == "before_local" else "before_local"
        rows = [(k, e.acc[self.eval_reading], e.n) for k, e in sorted(evaluations.items())]
        return rows, {f"acc_{other}": sum(e.acc[other] for e in evaluations.values()) / len(evaluations)}
