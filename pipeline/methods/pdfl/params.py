"""pDFL's params.yaml section (`pdfl:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from pipeline.capabilities import Never, Supports
from pipeline.config import Encoding, MethodParams


class PDFLParams(MethodParams):
    supports: ClassVar[Supports] = Supports(
        heterogeneous=Never("trains copies of its neighbours' models (one architecture for all)"),
        noise=Never("its clients relay models, knowledge and feedback copies to each other, not uploads to a server; "
                    "the noise covers what a client sends the server"))
    # 3 clients: the complete graph; 2 steps of each inner optimisation exercise them as 10 or 20 do
    tiny_setting: ClassVar[dict] = {"edge_prob": 1.0, "min_degree": 2, "external_steps": 2, "attention_steps": 2}
    class_rows: ClassVar[tuple[str, ...]] = ("encode_knowledge",)  # a row of P holds one value per class

    edge_prob: float = Field(0.25, gt=0, le=1)
    min_degree: int = Field(4, ge=1)
    max_redraws: int = Field(100, ge=1)
    topology: Literal["static", "redraw", "subsample"] = "redraw"
    subsample_fraction: float = Field(0.5, gt=0, le=1)
    heads: int = Field(4, ge=1)
    attention: bool = True
    attention_steps: int = Field(20, ge=0)
    attention_lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    attention_samples: int | None = Field(64, ge=1)
    order: Literal["head_then_body", "body_then_head"] = "head_then_body"
    internal_kd: bool = True
    external_kd: bool = True
    external_peers: int = Field(2, ge=1)
    external_steps: int = Field(10, ge=1)
    external_calibrate: bool = False
    kd_weight: float = Field(1.0, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    top_k: int = Field(2, ge=1)
    # how what a client relays travels on every edge (pipeline/methods/pdfl/method.py): the model states (its own
    # model and the feedback copies it trained for peers) as float32 | float16 | int8 (per tensor row), its
    # knowledge P as float32 | float16 | int8 | topk:K | argmax (no delta); float32 as the paper sends them
    encode_models: Literal["float32", "float16", "int8"] = "float32"
    encode_knowledge: Encoding = "float32"

    @field_validator("encode_knowledge")
    @classmethod
    def _no_delta(cls, value: str) -> str:
        if value.startswith("delta"):
            raise ValueError(f"pdfl.encode_knowledge = {value!r}: a client relays one knowledge payload to all its "
                             "neighbours, which need not hold the same copy of its last one (a neighbour it missed, a "
                             "neighbourhood that changes), so there is no one receiver's copy to send a change "
                             "against: use float32, float16, int8, topk:K or argmax")
        return value
