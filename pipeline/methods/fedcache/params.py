"""FedCache's params.yaml section (`fedcache:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipeline.config import MethodParams


class FedCacheParams(MethodParams):
    # round: every client reads the round-start cache, so the two executors agree bit for bit
    # (live, the default, runs client after client: the sequential executor only)
    tiny_setting: ClassVar[dict] = {"consistency": "round"}

    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    consistency: Literal["live", "round", "step"] = "live"
    cold_start: Literal["skip", "zeros"] = "skip"

    def check(self, params) -> None:
        if self.consistency == "step" and params.train.executor != "vectorized":
            raise ValueError("fedcache.consistency = 'step' makes all clients take each local step together, which "
                             f"only the vectorized executor does; train.executor is {params.train.executor!r}: set "
                             "train.executor: vectorized, or choose fedcache.consistency live or round")
