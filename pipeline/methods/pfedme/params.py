"""pFedMe's params.yaml section (`pfedme:`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from pipeline.capabilities import Never, Noised, Supports
from pipeline.federation.averaging_params import AveragingParams


class PFedMeParams(AveragingParams):  # encode_down, encode_up: there
    supports: ClassVar[Supports] = Supports(
        executors={"vectorized": Never("pfedme moves each client's local copy w toward its own personal model after "
                                       "every step")},
        schedules={"async": Never("pfedme's server moves the global model toward the round's mean by pfedme.beta; its "
                                  "asynchronous form (FedAsync's mixing serves FedAvg and MTFL) is not done")},
        heterogeneous=Never("averages model parameters"),
        # train.dp_noise: the change of w from the global state it downloaded (DP-FedAvg), both sent as float32
        noise=Noised(change=("params",), float32=("encode_up", "encode_down")))
    tiny_setting: ClassVar[dict] = {"K": 2}  # two inner steps still exercise w moving once per batch

    eta: float = Field(0.005, gt=0, allow_inf_nan=False)
    lambda_: float = Field(15.0, gt=0, allow_inf_nan=False, alias="lambda")
    beta: float = Field(1.0, gt=0, le=2, allow_inf_nan=False)
    K: int = Field(5, ge=1)
    # the official README's CNN command (its Cifar10 line): 0.01; its 0.09 is for the MNIST MLP, and on our ResNets it
    # learned far slower (scaled Table 5, round 1: 0.236 at 0.09, 0.418 at 0.01; docs/methods/pfedme.md)
    personal_lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    mu: float = Field(0.001, ge=0, allow_inf_nan=False)
