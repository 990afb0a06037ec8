"""FedDKC's params.yaml section (`feddkc:`)."""

from __future__ import annotations

from pydantic import Field

from pipeline.methods.gkt_params import ServerModelParams


class FedDKCParams(ServerModelParams):
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(0.12, gt=0, le=1, allow_inf_nan=False)
    temperature: float = Field(3.0, gt=0, allow_inf_nan=False)
