"""FD's params.yaml section (`fd:`)."""

from __future__ import annotations

from pydantic import Field

from pipeline.config import MethodParams


class FDParams(MethodParams):
    gamma: float = Field(1.0, ge=0, allow_inf_nan=False)
