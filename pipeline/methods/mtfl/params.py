"""MTFL's params.yaml section (`mtfl:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pipeline.capabilities import Never, Noised, Supports
from pipeline.federation.averaging_params import AveragingParams


class MTFLParams(AveragingParams):  # encode_down, encode_up: there
    # FedAsync under async (pipeline/federation/averaging.py)
    # train.dp_noise: the change of its state from the global one it downloaded (DP-FedAvg), both sent as float32
    supports: ClassVar[Supports] = Supports(schedules={"async": True},
                                            heterogeneous=Never("averages model parameters"),
                                            noise=Noised(change=("params",), float32=("encode_up", "encode_down")))

    # before_local: the round's figure is MTFL's own reading, the new global shared tensors with the
    # client's private BatchNorm, before any local training on them; after_local: the client's model as
    # its local training left it (the other reading is kept as a round metric either way)
    eval: Literal["before_local", "after_local"] = "before_local"
