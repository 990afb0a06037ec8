"""The server-model knobs FedDKC and FedICT share (their server half is pipeline/federation/gkt.py)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipeline.config import MethodParams


class ServerModelParams(MethodParams):
    # the smaller server model on larger batches: 3 clients' uploads need no more
    tiny_setting: ClassVar[dict] = {"server_model": "a3", "server_batch_size": 32}

    server_model: Literal["a4s", "a3"] = "a4s"
    server_epochs: int = Field(1, ge=1)
    server_batch_size: int | None = Field(None, ge=1)
