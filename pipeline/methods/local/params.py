"""Local-only training has no knobs of its own (`local:` stays empty)."""

from __future__ import annotations

from typing import ClassVar

from pipeline.capabilities import Noised, Supports
from pipeline.config import MethodParams


class LocalParams(MethodParams):
    # async: nothing is exchanged: each client trains at its device's pace
    supports: ClassVar[Supports] = Supports(schedules={"async": True}, noise=Noised(float32=()))  # uploads nothing
