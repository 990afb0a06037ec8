"""FedAvg's params.yaml section (`fedavg:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.config import MethodParams


class FedAvgParams(MethodParams):
    homogeneous_only: ClassVar[bool] = True

    eval_model: Literal["personalized", "global"] = "personalized"
