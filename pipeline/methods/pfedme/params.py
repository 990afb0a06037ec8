"""pFedMe's params.yaml section (`pfedme:`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pipeline.config import MethodParams


class PFedMeParams(MethodParams):
    homogeneous_only: ClassVar[bool] = True  # averages model parameters

    eta: float = Field(0.005, gt=0, allow_inf_nan=False)
    lambda_: float = Field(15.0, gt=0, allow_inf_nan=False, alias="lambda")
    beta: float = Field(1.0, gt=0, le=2, allow_inf_nan=False)
