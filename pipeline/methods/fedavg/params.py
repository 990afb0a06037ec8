"""FedAvg's params.yaml section (`fedavg:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.capabilities import Never, Noised, Supports
from pipeline.federation.averaging_params import AveragingParams


class FedAvgParams(AveragingParams):  # encode_down, encode_up: there
    # FedAsync under async (pipeline/federation/averaging.py)
    # train.dp_noise: the change of its state from the global one it downloaded (DP-FedAvg), both sent as float32
    supports: ClassVar[Supports] = Supports(schedules={"async": True},
                                            heterogeneous=Never("averages model parameters"),
                                            noise=Noised(change=("params",), float32=("encode_up", "encode_down")))

    eval_model: Literal["personalized", "global"] = "personalized"
