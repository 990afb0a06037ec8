"""pFedMe: personalized FL with Moreau envelopes (Dinh et al., NeurIPS 2020), as one of the FedCache
paper's compared methods (section 5.1.4: eta = 0.005, lambda = 15, beta = 1).

Each client keeps two models: its personal model theta (the one trained step by step and the
one evaluated: pFedMe's personalized reading) and its local copy w of the global model. One
round, for every selected client:
  1. receive the global parameters w_g (and BatchNorm buffers): theta <- w_g, w <- w_g;
  2. for every batch of one local epoch: one SGD step on theta (train.lr, momentum, weight
     decay) on CE(theta(x), y) + lambda/2 * ||theta - w||^2, then the local copy moves toward it:
     w <- w - eta * lambda * (w - theta);
  3. upload w (and theta's BatchNorm buffers).
The server: w_g <- (1 - beta) * w_g + beta * (sample-weighted mean of the uploads); beta = 1 is
plain averaging.

Departure (README "pFedMe"): the paper solves theta's Moreau-envelope problem with K inner
steps per batch (K = 5 in its experiments); the executor takes one optimizer step per batch, so
K = 1 here. Homogeneous only; the sequential executor (the w update after every step needs the
client's own theta, which the vectorized executor does not expose). Bytes: every state_dict
tensor down and up, as FedAvg.
"""

from __future__ import annotations

import torch

from pipeline.federation.contract import LocalUpdate, ServerContext, Upload
from pipeline.federation.averaging import ParameterAveraging, state_copy
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


class PFedMeClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.pfedme
        self.w: dict[str, torch.Tensor] = {}  # the local copy of the client in training (one client at a time)
        self.stepped = False  # an optimizer step on theta was taken since w last moved

    def begin(self, client, download, round_):
        (glob,) = download
        client.model.load_state_dict(glob.arrays)  # theta <- w_g
        client.optimizer.state.clear()
        self.w = {n: p.detach().clone() for n, p in client.model.named_parameters()}  # w <- w_g
        self.stepped = False
        return {}

    def _move_w(self, model) -> None:
        """w <- w - eta * lambda * (w - theta), with theta as it is after the last step."""
        rate = self.p.eta * self.p.lambda_
        with torch.no_grad():
            for n, theta in model.named_parameters():
                self.w[n].sub_(rate * (self.w[n] - theta))

    def loss(self, model, step, phase):
        if self.stepped:
            self._move_w(model)
        self.stepped = True  # the executor steps theta on this loss
        prox = sum(((theta - self.w[n]) ** 2).sum() for n, theta in model.named_parameters())
        return ce_rows(model(step.x), step.y) + self.p.lambda_ / 2 * prox  # the same prox term on every row

    def end(self, client, targets, records, round_):
        if self.stepped:
            self._move_w(client.model)
        state = state_copy(client.model)  # theta's BatchNorm buffers, w's parameters
        state.update({n: t.detach().cpu().clone() for n, t in self.w.items()})
        return Upload([Payload("params", state)], {"weight": float(client.num_train)})


class PFedMe(ParameterAveraging):
    name = "pfedme"
    client_cls = PFedMeClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx, state_copy(ctx.initial_model(0)))
        self.beta = ctx.params.pfedme.beta

    @classmethod
    def vectorized_unsupported(cls, params):
        return "pfedme moves each client's local copy w toward its own personal model after every step"

    def aggregate(self, round_, uploads):
        mean = self.mean_upload(uploads)
        if self.beta == 1.0:
            self.global_state = mean
        else:  # integer buffers (BatchNorm's counter) are taken from the mean
            self.global_state = {n: ((1 - self.beta) * self.global_state[n] + self.beta * t).to(t.dtype)
                                 if t.is_floating_point() else t for n, t in mean.items()}
