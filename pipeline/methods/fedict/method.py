"""FedICT: federated multi-task distillation (Wu et al., TPDS 2023), one of the FedCache paper's
compared methods (section 5.1.4: similarity-based LKA, beta = lambda = mu = 1.5, T = 3.0).

The round is the FedGKT skeleton of pipeline/methods/gkt.py. FedICT keeps the local and the
global knowledge apart in the two distillation directions, using each client's label
distribution d_k (the share of each class among its training samples):

  client, FPKD (federated prior knowledge distillation): the KL toward the server's logits, plus
      the same KL with each class's term weighted by the client's prior d_k,c, so the classes the
      client actually holds weigh more:
        CE + beta * T^2 * sum_c (1 + mu * d_k,c) * q_c * log(q_c / p_c)
      q = softmax(server logits / T), p = softmax(client logits / T);
  server, similarity-based LKA (local knowledge adjustment): A4^S distils client k's logits with
      a weight that grows with how close d_k is to the global label distribution d (the labels of
      the round's uploads), so knowledge from typical clients counts more:
        CE + lambda * (1 + cos(d_k, d)) * T^2 * KL(softmax(client logits / T) || softmax(out / T)).

These follow the structure of the official code (a plain KL plus a prior- or similarity-weighted
KL); where it leaves the weights' scale open, mu and lambda set it (README "FedDKC and FedICT").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.methods.gkt import GKTClient, GKTServer, label_distribution
from pipeline.federation.contract import ServerContext
from pipeline.federation.losses import kd_rows, teacher_weight


class FedICTClient(GKTClient):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.beta = params.fedict.beta

    def targets(self, client):
        prior = label_distribution(client.y_train, self.num_classes).to(client.y_train.device)
        return {"prior": prior.expand(client.num_train, -1)}  # the same row for every sample

    def client_kd_rows(self, logits, step):
        p = self.params.fedict
        teacher, has = teacher_weight(step.t["teacher"])
        log_q = F.log_softmax(teacher / p.T, dim=1)
        per_class = log_q.exp() * (log_q - F.log_softmax(logits / p.T, dim=1))  # q_c log(q_c / p_c)
        return (per_class * (1 + p.mu * step.t["prior"])).sum(dim=1) * has * (p.T * p.T)


class FedICT(GKTServer):
    name = "fedict"
    client_cls = FedICTClient

    def __init__(self, ctx: ServerContext):
        p = ctx.params.fedict
        super().__init__(ctx, p.server_model, p.server_epochs, p.server_batch_size)
        self.p = p
        self.similarity = torch.zeros(ctx.num_clients)  # cos(d_k, d) of the round's uploads

    def begin_aggregate(self, uploads):
        C = self.ctx.num_classes
        glob = label_distribution(torch.cat([a["labels"] for a in uploads.values()]), C)
        for k, a in uploads.items():
            self.similarity[k] = F.cosine_similarity(label_distribution(a["labels"], C), glob, dim=0)

    def server_kd_rows(self, out, client_logits, owner):
        weight = 1 + self.similarity.to(out.device)[owner]
        return self.p.lambda_ * weight * kd_rows(out, client_logits, self.p.T)
