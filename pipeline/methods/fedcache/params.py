"""FedCache's params.yaml section (`fedcache:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.capabilities import Noised, Only, Supports
from pipeline.config import Encoding, MethodParams, messages_can_be_dropped


class FedCacheParams(MethodParams):
    # round: every client reads the round-start cache, so the two executors agree bit for bit
    # (step, the default, needs the vectorized executor; live runs client after client)
    tiny_setting: ClassVar[dict] = {"consistency": "round"}
    # live: each batch reads what earlier clients wrote this round (one client after another); step: all clients
    # take each local step together (the vectorized executor); both call the server at every step, which a Dask
    # worker cannot, and which is not done at each step's simulated instant (deadline, quorum, async: under async
    # round consistency reads the cache when an update starts and writes the logits when its upload arrives)
    supports: ClassVar[Supports] = Supports(
        executors={"sequential": Only("consistency", ("live", "round"), "fedcache.consistency step makes all clients "
                                      "take each local step together, which only the vectorized executor does"),
                   "vectorized": Only("consistency", ("step", "round"), "fedcache.consistency live lets each batch "
                                      "read what earlier clients wrote in the same round, one client after another"),
                   "dask": Only("consistency", ("round",), "its client half calls the per-step exchange hook, which "
                                "needs the server half beside it at every step (a Dask worker has none)")},
        schedules={s: Only("consistency", ("round",), "the cache read at every step's simulated instant is not done "
                           "yet") for s in ("deadline", "quorum", "async")},
        noise=Noised())  # train.dp_noise: its logits, each per-step exchange's (live, step) or the round's (round)

    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    # step by default: what devices training at the same time see, within the seeds' spread of the
    # official code's live order (docs/methods/fedcache.md, measured); the paper presets pin live
    consistency: Literal["live", "round", "step"] = "step"
    cold_start: Literal["skip", "zeros"] = "skip"
    # how the logits travel up and the teachers down (pipeline/encoding_spec.py: float32, float16, int8, topk:K,
    # argmax, delta:T[+E]); float32 as the paper sends them
    encode_up: Encoding = "float32"
    encode_down: Encoding = "float32"

    @model_validator(mode="after")
    def _delta_needs_rounds(self) -> "FedCacheParams":
        for key in ("encode_up", "encode_down"):
            value = getattr(self, key)
            if value.startswith("delta") and self.consistency != "round":
                raise ValueError(f"fedcache.{key} = {value!r} keeps the receiver's copy of every sample from round to "
                                 f"round, which needs fedcache.consistency: round (it is {self.consistency!r}: its "
                                 "exchange is per batch)")
        return self

    def check(self, params) -> None:
        lost = messages_can_be_dropped(params)
        for key in ("encode_up", "encode_down"):
            value = getattr(self, key)
            if value.startswith("delta") and "fedcache" in params.train.algorithms and lost:
                raise ValueError(f"fedcache.{key} = {value!r} sends only the rows that moved since the receiver's "
                                 "copy, which the sender keeps as if every message arrived: a message dropped by the "
                                 "simulated clock (a deadline, a quorum, a device going offline) would leave the two "
                                 f"copies apart for good. Use another fedcache.{key} here (int8, float16, ...), or "
                                 "train.schedule: sync with devices.online_mean_s: null")
