"""MTFL has no knobs of its own yet (`mtfl:` stays empty)."""

from __future__ import annotations

from typing import ClassVar

from pipeline.config import MethodParams


class MTFLParams(MethodParams):
    homogeneous_only: ClassVar[bool] = True  # averages model parameters
