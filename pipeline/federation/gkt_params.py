"""The server-model and encoding knobs FedDKC and FedICT share (their server half is pipeline/federation/gkt.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.capabilities import Never, Supports
from pipeline.config import Encoding, MethodParams


class ServerModelParams(MethodParams):
    supports: ClassVar[Supports] = Supports(
        noise=Never("every round it uploads each sample's stem features with its label for the server to train on, "
                    "which the noise on uploads is not set up for (a per-sample clip, and labels in the clear)"))
    # the smaller server model on larger batches: 3 clients' uploads need no more
    tiny_setting: ClassVar[dict] = {"server_model": "a3", "server_batch_size": 32}

    server_model: Literal["a4s", "a3"] = "a4s"
    server_epochs: int = Field(1, ge=1)
    server_batch_size: int | None = Field(None, ge=1)
    # how the clients' stem features and logits travel up (float32 | float16 | int8 | topk:K or topk:F; the labels as
    # they are) and the server's logits down (float32 | float16 | int8 | topk | argmax): pipeline/encoding_spec.py
    encode_up: Encoding = "float32"
    encode_down: Encoding = "float32"

    @field_validator("encode_up")
    @classmethod
    def _no_hard_label_features(cls, value: str) -> str:
        if value == "argmax":
            raise ValueError("'argmax': the upload's stem features travel with the same encoding as its logits, and "
                             "argmax keeps a row's largest column only (a hard label), which says nothing of a feature "
                             "map: use float32, float16, int8 or topk:K / topk:F (a feature map keeps its values "
                             "largest in magnitude, the others 0; encode_down takes argmax)")
        return value

    @field_validator("encode_up", "encode_down")
    @classmethod
    def _no_delta(cls, value: str, info: ValidationInfo) -> str:
        # a delta's sender keeps the receiver's copy of every row it sent
        if value.startswith("delta"):
            why = ("the server would have to keep every client's features, which it does not (it trains on the "
                   "round's uploads), and they move whenever a client trains: use float32, float16 or int8"
                   if info.field_name == "encode_up" else
                   "the server's logits are made anew while its model trains each round, so every row moves, and a "
                   "download lost to a device going offline would leave the two copies apart: use float32, float16, "
                   "int8, topk:K or argmax")
            raise ValueError(f"{value!r}: no delta encoding here: {why}")
        return value
