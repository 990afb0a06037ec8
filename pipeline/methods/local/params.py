"""Local-only training has no knobs of its own (`local:` stays empty)."""

from __future__ import annotations

from pipeline.config import MethodParams


class LocalParams(MethodParams):
    pass
