"""FedProto's params.yaml section (`fedproto:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.config import MethodParams


class FedProtoParams(MethodParams):
    lambda_: float = Field(1.0, ge=0, allow_inf_nan=False, alias="lambda")
    eval: Literal["classifier", "prototype"] = "classifier"
    prototype: Literal["mean", "median"] = "mean"
    aggregation: Literal["count", "uniform", "confidence"] = "count"
    align: bool = False
    align_dim: int = Field(64, ge=1)
    compress: bool = False
    topk_fraction: float = Field(0.1, gt=0, le=1)
