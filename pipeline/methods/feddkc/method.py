"""FedDKC: federated distillation with distributed knowledge congruence (Wu et al.), one of the
FedCache paper's compared methods (section 5.1.4: KKR refinement, beta = 1.5, T = 0.12).

The round is the FedGKT skeleton of pipeline/federation/gkt.py (clients upload stem features,
logits and labels; the server trains A4^S on them and sends its logits back). What FedDKC adds
is on the server: before A4^S distils a client's knowledge, the knowledge is *refined* so that
every client's knowledge has the same peak probability T, whatever its model (A1, A2 or A3) and
however confident it is. That is KKR, the kernel-based knowledge refinement: a linear map of
the probability vector p with largest entry m, where p is the softmax of the client's logits
divided by S and then by `temperature` (the official code's scaling, S = 0.05: the knowledge is
sharpened before KKR lowers its peak to T),

    q = ((C*T - 1) * p + m - T) / (C*m - 1),

which keeps the sum at 1, the ranking of the classes, and sets the largest entry to T. When the
map would make an entry negative (T above m by too much) or p is uniform, q is T on the top
class and (1 - T) / (C - 1) on every other class.

Losses, as the official code (its `alpha` is our `beta`), T_kd = `temperature`:
  client  CE + beta * T_kd^2 KL(softmax(server logits / T_kd) || softmax(client / T_kd))
  server  beta * CE + T_kd^2 KL(q || softmax(A4^S output / T_kd))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.federation.gkt import GKTClient, GKTServer
from pipeline.federation.contract import ServerContext
from pipeline.errors import ConfigError
from pipeline.federation.losses import kd_rows, soft_kd_rows


def kkr(probs: torch.Tensor, peak: float) -> torch.Tensor:
    """KKR refinement of probability rows [n, C]: each row's largest entry becomes `peak`."""
    C = probs.shape[1]
    top = probs.max(dim=1, keepdim=True)
    denom = C * top.values - 1
    refined = ((C * peak - 1) * probs + top.values - peak) / denom.clamp_min(1e-12)
    fallback = torch.full_like(probs, (1 - peak) / (C - 1)).scatter_(1, top.indices, peak)
    unusable = (denom <= 1e-6) | (refined.min(dim=1, keepdim=True).values < 0)
    return torch.where(unusable, fallback, refined)


class FedDKCClient(GKTClient):
    method = "feddkc"

    def client_kd_rows(self, logits, step):
        return kd_rows(logits, step.t["teacher"], self.params.feddkc.temperature)


class FedDKC(GKTServer):
    name = "feddkc"
    client_cls = FedDKCClient

    def __init__(self, ctx: ServerContext):
        p = ctx.params.feddkc
        if p.T <= 1 / ctx.num_classes:
            raise ConfigError(f"feddkc.T = {p.T}: KKR's peak probability must exceed 1/C = "
                              f"{1 / ctx.num_classes:.3g} for {ctx.num_classes} classes; the paper uses 0.12")
        super().__init__(ctx, p.server_model, p.server_epochs, p.server_batch_size, ce_weight=p.beta)
        self.p = p

    def server_kd_rows(self, out, client_logits, owner):
        refined = kkr(F.softmax(client_logits / (self.p.S * self.p.temperature), dim=1), self.p.T)
        return soft_kd_rows(out, refined, self.p.temperature)
