"""FedAvg's params.yaml section (`fedavg:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.capabilities import Never, Supports
from pipeline.federation.averaging_params import AveragingParams


class FedAvgParams(AveragingParams):  # encode_down, encode_up: there
    # FedAsync under async (pipeline/federation/averaging.py)
    supports: ClassVar[Supports] = Supports(schedules={"async": True},
                                            heterogeneous=Never("averages model parameters"))

    eval_model: Literal["personalized", "global"] = "personalized"
