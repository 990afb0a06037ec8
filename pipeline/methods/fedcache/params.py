"""FedCache's params.yaml section (`fedcache:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipeline.config import MethodParams


class FedCacheParams(MethodParams):
    # round: every client reads the round-start cache, so the two executors agree bit for bit
    # (step, the default, needs the vectorized executor; live runs client after client)
    tiny_setting: ClassVar[dict] = {"consistency": "round"}

    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    # step by default: what devices training at the same time see, within the seeds' spread of the
    # official code's live order (docs/methods/fedcache.md, measured); the paper presets pin live
    consistency: Literal["live", "round", "step"] = "step"
    cold_start: Literal["skip", "zeros"] = "skip"

    def check(self, params) -> None:
        if self.consistency == "step" and params.train.executor != "vectorized":
            raise ValueError("fedcache.consistency = 'step' makes all clients take each local step together, which "
                             f"only the vectorized executor does; train.executor is {params.train.executor!r}: set "
                             "train.executor: vectorized, or choose fedcache.consistency live or round")
        if params.train.schedule == "async" and self.consistency != "round":
            # under async a client reads the cache when its update starts and writes it when the update ends
            # (round consistency's download and upload, at the client's own instants); reading it per batch at
            # each batch's simulated instant is not done yet
            raise ValueError(f"train.schedule = 'async' with fedcache.consistency = {self.consistency!r} (the cache "
                             "read at every batch) is not done yet: set fedcache.consistency: round (each client "
                             "reads the cache when its update starts and writes its logits when it ends), or "
                             "train.schedule: sync")
