"""FedICT's params.yaml section (`fedict:`)."""

from __future__ import annotations

from pydantic import Field

from pipeline.methods.gkt_params import ServerModelParams


class FedICTParams(ServerModelParams):
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    lambda_: float = Field(1.5, ge=0, allow_inf_nan=False, alias="lambda")
    mu: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
