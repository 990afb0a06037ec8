"""MTFL's params.yaml section (`mtfl:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.capabilities import Never, Supports
from pipeline.config import MethodParams


class MTFLParams(MethodParams):
    # FedAsync under async (pipeline/federation/averaging.py)
    supports: ClassVar[Supports] = Supports(schedules={"async": True},
                                            heterogeneous=Never("averages model parameters"))

    # before_local: the round's figure is MTFL's own reading, the new global shared tensors with the
    # client's private BatchNorm, before any local training on them; after_local: the client's model as
    # its local training left it (the other reading is kept as a round metric either way)
    eval: Literal["before_local", "after_local"] = "before_local"
    # how the global state travels down and each client's change to it up: float32 (as computed) | float16 |
    # int8 (a byte a value, a minimum and step per tensor row: pipeline/federation/averaging.py)
    encode_down: Literal["float32", "float16", "int8"] = "float32"
    encode_up: Literal["float32", "float16", "int8"] = "float32"
