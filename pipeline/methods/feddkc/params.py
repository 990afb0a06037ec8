"""FedDKC's params.yaml section (`feddkc:`); defaults as the official code."""

from __future__ import annotations

from pydantic import Field

from pipeline.federation.gkt_params import ServerModelParams


class FedDKCParams(ServerModelParams):
    # the official code's `alpha`: the weight of the KL on the clients and of CE on the server
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(0.12, gt=0, le=1, allow_inf_nan=False)  # KKR's peak probability
    temperature: float = Field(3.0, gt=0, allow_inf_nan=False)  # KD temperature of both terms
    # the server divides a client's logits by S before the softmax KKR refines (the official `S`); 1: none
    S: float = Field(0.05, gt=0, allow_inf_nan=False)
