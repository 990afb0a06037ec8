"""pFedMe: personalized FL with Moreau envelopes (Dinh et al., NeurIPS 2020), as one of the FedCache
paper's compared methods (section 5.1.4: eta = 0.005, lambda = 15, beta = 1).

Each client keeps two models: its personal model theta (the one trained and the one evaluated:
pFedMe's personalized reading) and its local copy w of the global model. One round, for every
selected client:
  1. receive the global parameters w_g (and BatchNorm buffers): theta <- w_g, w <- w_g;
  2. for every batch of one local epoch, solve theta's Moreau-envelope problem approximately with
     K plain gradient steps on that same batch (`pfedme.K`, at `pfedme.personal_lr`, with the
     official optimizer's L2 term `pfedme.mu`):
       theta <- theta - personal_lr * (grad CE(theta(x), y) + lambda * (theta - w) + mu * theta),
     then move the local copy toward it once: w <- w - eta * lambda * (w - theta);
  3. upload w (and theta's BatchNorm buffers).
The server: w_g <- (1 - beta) * w_g + beta * (sample-weighted mean of the uploads); beta = 1 is
plain averaging. As the paper's algorithm 1 and its official code (userpFedMe.py,
pFedMeOptimizer); a round is train.local_epochs epochs of batches here, where the official code
takes `local_epochs` single batches.

The K steps are the phase's `repeat` (each batch taken K times in a row by the executor); theta's
optimizer is a plain SGD at personal_lr with weight decay mu, which `prepare` gives the client in
place of the train section's (momentum-)SGD. Homogeneous only; the sequential executor (w moves
after every K steps toward the client's own theta, which the vectorized executor does not expose).
Bytes: every state_dict tensor down and up, as FedAvg.
"""

from __future__ import annotations

import torch

from pipeline.federation.contract import LocalUpdate, Phase, ServerContext, Upload, sample_count
from pipeline.federation.averaging import ParameterAveraging, receive_state, state_codes, state_copy, state_payload
from pipeline.federation.losses import ce_rows


class PFedMeClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.pfedme
        self.codes = state_codes(params, "pfedme")  # (encode_down, encode_up)
        self.w: dict[str, torch.Tensor] = {}  # the local copy of the client in training (one client at a time)
        self.steps = 0  # steps taken on theta this round (K per batch)

    def prepare(self, client):
        """theta's solver: plain gradient steps at the personal learning rate, mu as weight decay."""
        client.optimizer = torch.optim.SGD(client.model.parameters(), lr=self.p.personal_lr, momentum=0.0,
                                           weight_decay=self.p.mu)

    def phases(self, round_):
        return [Phase(repeat=self.p.K)]

    def begin(self, client, download, round_):
        (glob,) = download
        client.model.load_state_dict(receive_state(client, glob, self.codes, state_copy(client.model)))  # theta <- w_g
        self.w = {n: p.detach().clone() for n, p in client.model.named_parameters()}  # w <- w_g
        self.steps = 0
        return {}

    def _move_w(self, model) -> None:
        """w <- w - eta * lambda * (w - theta), with theta as it is after a batch's K steps."""
        rate = self.p.eta * self.p.lambda_
        with torch.no_grad():
            for n, theta in model.named_parameters():
                self.w[n].sub_(rate * (self.w[n] - theta))

    def loss(self, model, step, phase):
        if self.steps and self.steps % self.p.K == 0:  # the previous batch's K steps are done
            self._move_w(model)
        self.steps += 1  # the executor steps theta on this loss
        prox = sum(((theta - self.w[n]) ** 2).sum() for n, theta in model.named_parameters())
        return ce_rows(model(step.x), step.y) + self.p.lambda_ / 2 * prox  # the same prox term on every row

    def end(self, client, targets, records, round_):
        if self.steps:
            self._move_w(client.model)
        state = state_copy(client.model)  # theta's BatchNorm buffers, w's parameters
        state.update({n: t.detach().cpu().clone() for n, t in self.w.items()})
        return Upload([state_payload(client, state, self.codes[1]), sample_count(client.num_train)])


class PFedMe(ParameterAveraging):
    name = "pfedme"
    client_cls = PFedMeClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx, state_copy(ctx.initial_model(0)))
        self.beta = ctx.params.pfedme.beta

    def aggregate(self, round_, uploads):
        mean = self.mean_upload(uploads)
        if self.beta == 1.0:
            self.global_state = mean
        else:  # integer buffers (BatchNorm's counter) are taken from the mean
            self.count_work(3.0 * sum(t.numel() for t in mean.values()))
            self.global_state = {n: ((1 - self.beta) * self.global_state[n] + self.beta * t).to(t.dtype)
                                 if t.is_floating_point() else t for n, t in mean.items()}
