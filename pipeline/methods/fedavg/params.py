"""FedAvg's params.yaml section (`fedavg:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.capabilities import Never, Supports
from pipeline.config import MethodParams


class FedAvgParams(MethodParams):
    # FedAsync under async (pipeline/federation/averaging.py)
    supports: ClassVar[Supports] = Supports(schedules={"async": True},
                                            heterogeneous=Never("averages model parameters"))

    eval_model: Literal["personalized", "global"] = "personalized"
    # how the global state travels down and each client's change to it up: float32 (as computed) | float16 |
    # int8 (a byte a value, a minimum and step per tensor row: pipeline/federation/averaging.py)
    encode_down: Literal["float32", "float16", "int8"] = "float32"
    encode_up: Literal["float32", "float16", "int8"] = "float32"
