"""FD's params.yaml section (`fd:`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator

from pipeline.capabilities import Noised, Supports
from pipeline.config import Encoding, MethodParams


class FDParams(MethodParams):
    # async: a client's upload replaces its class logits when it arrives; its download is the leave-one-out mean
    # of the others' latest logits when its update starts
    # train.dp_noise: its per-class mean logits (the class ids travel in the clear)
    supports: ClassVar[Supports] = Supports(schedules={"async": True}, noise=Noised())

    gamma: float = Field(1.0, ge=0, allow_inf_nan=False)
    # how each client's per-class mean logits travel up and its class teachers down (pipeline/encoding_spec.py:
    # float32, float16, int8, topk:K, argmax); the class ids travel as they are (int64)
    encode_up: Encoding = "float32"
    encode_down: Encoding = "float32"

    @field_validator("encode_up", "encode_down")
    @classmethod
    def _no_delta(cls, value: str) -> str:
        # a delta's sender keeps the receiver's copy; a download or upload lost to a simulated device going offline
        # (or a deadline) would leave the two copies apart with nothing to tell the sender, and FD's payload is a few
        # class rows of C values a round, with little a delta could save
        if value.startswith("delta"):
            raise ValueError(f"{value!r}: FD takes no delta encoding (its sender would have to keep the receiver's "
                             "copy of every class row, which a payload lost to a device going offline leaves out of "
                             "step, for a payload of a few class rows): use float32, float16, int8, topk:K or argmax")
        return value
