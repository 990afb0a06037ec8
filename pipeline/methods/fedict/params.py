"""FedICT's params.yaml section (`fedict:`); defaults as the official code (wuzhiyuan2000/FedICT)."""

from __future__ import annotations

from pydantic import Field

from pipeline.federation.gkt_params import ServerModelParams


class FedICTParams(ServerModelParams):
    # the official code's `alpha`: the weight of FPKD on the clients and of CE on the server
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    # FPKD: class c's KL term weighs 1 + d_k,c / prior_T (the official `fpkd_T`); null: no prior, a plain KL
    prior_T: float | None = Field(3.0, gt=0, allow_inf_nan=False)
    # similarity-based LKA: client k's knowledge weighs 1 + cos(d_k, d) on the server; false: weight 1
    similarity: bool = True
