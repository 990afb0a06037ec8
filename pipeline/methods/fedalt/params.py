"""FedAlt's params.yaml section (`fedalt:`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from pipeline.capabilities import Never, Supports
from pipeline.config import messages_can_be_dropped
from pipeline.federation.averaging_params import AveragingParams


class FedAltParams(AveragingParams):  # encode_down (its blocks), encode_up: there
    supports: ClassVar[Supports] = Supports(
        heterogeneous=Never("averages the blocks of one multi-exit ResNet-20 across clients"),
        noise=Never("a client uploads all its blocks but downloads only the first m_k, so a block's change has no "
                    "download of the same round to be read against"))

    tau: int = Field(5, ge=1)
    capacity: list[float] = [0.3, 0.4, 0.3]
    congestion: float = Field(0.2, ge=0, le=1, allow_inf_nan=False)
    lambda_: float = Field(1.0, ge=0, allow_inf_nan=False, alias="lambda")
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    distill: Literal["two_way", "one_way"] = "two_way"
    distill_warmup: int = Field(0, ge=0)

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, v: list[float]) -> list[float]:
        if len(v) != 3:
            raise ValueError(f"must list 3 probabilities, P(compute tier = 1, 2, 3 blocks) of the multi-exit "
                             f"ResNet-20's 3 blocks; got {len(v)}")
        if any(not (p >= 0 and p <= 1) for p in v):
            raise ValueError("every probability must lie in [0, 1]")
        if abs(sum(v) - 1) > 1e-6:
            raise ValueError(f"the probabilities must sum to 1; they sum to {sum(v):g}")
        return v

    def check(self, params) -> None:
        if (self.encode_up != "float32" and "fedalt" in params.train.algorithms
                and messages_can_be_dropped(params)):
            raise ValueError(f"fedalt.encode_up = {self.encode_up!r} sends each block as its change to the server's "
                             "copy of the client's model, which an upload dropped by the simulated clock (a deadline, "
                             "a quorum, a device going offline) would leave apart from the client's until the block "
                             "is next sent down: use fedalt.encode_up: float32 here (or train.schedule: sync with "
                             "devices.online_mean_s: null)")
