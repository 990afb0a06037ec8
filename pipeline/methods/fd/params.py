"""FD's params.yaml section (`fd:`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pipeline.capabilities import Supports
from pipeline.config import MethodParams


class FDParams(MethodParams):
    # async: a client's upload replaces its class logits when it arrives; its download is the leave-one-out mean
    # of the others' latest logits when its update starts
    supports: ClassVar[Supports] = Supports(schedules={"async": True})

    gamma: float = Field(1.0, ge=0, allow_inf_nan=False)
