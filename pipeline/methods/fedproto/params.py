"""FedProto's params.yaml section (`fedproto:`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from pipeline.capabilities import Noised, Supports
from pipeline.config import Encoding, MethodParams, messages_can_be_dropped
from pipeline.encoding_spec import check_columns
from pipeline.encoding_spec import parse as parse_encoding

REPLACED = ("fedproto.{key} was replaced by fedproto.encode_up (pipeline/encoding_spec.py), e.g. topk:K (each "
            "prototype's K largest-magnitude values), int8 (a byte a value) or delta:T+int8 (only the prototypes "
            "that moved by more than T); remove fedproto.{key}")


class FedProtoParams(MethodParams):
    # train.dp_noise: its prototypes (and per-class accuracies, confidence aggregation); class ids and counts in the clear
    supports: ClassVar[Supports] = Supports(noise=Noised())
    class_rows: ClassVar[tuple[str, ...]] = ()  # a prototype's row holds its features, checked below

    lambda_: float = Field(1.0, ge=0, allow_inf_nan=False, alias="lambda")
    eval: Literal["classifier", "prototype"] = "classifier"
    prototype: Literal["mean", "median"] = "mean"
    aggregation: Literal["count", "uniform", "confidence"] = "count"
    align: bool = False
    align_dim: int = Field(64, ge=1)
    # how each client's prototypes travel up and the global prototypes down, a row per class
    # (pipeline/encoding_spec.py: float32, float16, int8, topk:K, delta:T[+E]); float32 as the paper sends them
    encode_up: Encoding = "float32"
    encode_down: Encoding = "float32"

    @model_validator(mode="before")
    @classmethod
    def _replaced_keys(cls, data: Any) -> Any:
        """`compress` and `topk_fraction` (a top-k int8 delta of its own, before the encodings) are gone: a file
        that turned compression off still loads (what it asked for is the default), one that turned it on is
        refused naming the replacement."""
        if not isinstance(data, dict) or not {"compress", "topk_fraction"} & set(data):
            return data
        if data.get("compress", False) is not False:
            raise ValueError(REPLACED.format(key="compress"))
        return {key: value for key, value in data.items() if key not in ("compress", "topk_fraction")}

    @model_validator(mode="after")
    def _prototype_encodings(self) -> "FedProtoParams":
        for key in ("encode_up", "encode_down"):
            spec = parse_encoding(getattr(self, key))
            if spec.kind == "argmax":
                raise ValueError(f"fedproto.{key} = 'argmax': a prototype's values are features, not class scores, "
                                 "so the index of its largest one says nothing a receiver can use (topk:K keeps "
                                 "the K largest-magnitude values)")
            # the prototype size: align_dim with align, else the clients' feature size, checked when the server
            # half is built (FedProto.__init__)
            why = check_columns(spec, self.align_dim) if self.align else None
            if why:
                raise ValueError(f"fedproto.{key} = {str(spec)!r}: {why} (the prototypes have align_dim values)")
        return self

    def check(self, params) -> None:
        for key in ("encode_up", "encode_down"):
            value = getattr(self, key)
            if value.startswith("delta") and "fedproto" in params.train.algorithms and messages_can_be_dropped(params):
                raise ValueError(f"fedproto.{key} = {value!r} sends only the prototypes that moved since the "
                                 "receiver's copy, which the sender keeps as if every message arrived: a message "
                                 "dropped by the simulated clock (a deadline, a quorum, a device going offline) would "
                                 f"leave the two copies apart for good. Use another fedproto.{key} here (int8, "
                                 "float16, ...), or train.schedule: sync with devices.online_mean_s: null")
