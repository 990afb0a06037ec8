"""Parameter averaging, shared by the methods that average models (FedAvg, MTFL, pFedMe, FedAlt):
the sample-weighted mean of state dicts, and the server half that keeps one global state."""

from __future__ import annotations

import torch

from pipeline.federation.contract import Method, ServerContext, Wire, state_bytes
from pipeline.federation.ledger import Payload


def weighted_average(states: list[dict[str, torch.Tensor]], weights: list[float]) -> dict[str, torch.Tensor]:
    """Per-tensor weighted mean; integer buffers (BatchNorm's step counter) are rounded back."""
    total = float(sum(weights))
    out = {}
    for name, first in states[0].items():
        acc = sum(s[name].double() * (w / total) for s, w in zip(states, weights))
        out[name] = acc.round().to(first.dtype) if not first.is_floating_point() else acc.to(first.dtype)
    return out


def state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in model.state_dict().items()}


class ParameterAveraging(Method):
    """The server half of the parameter-averaging methods (FedAvg, MTFL, pFedMe): one global state
    sent to every selected client, replaced by the sample-weighted mean of what they upload."""


    def __init__(self, ctx: ServerContext, global_state: dict[str, torch.Tensor]):
        super().__init__(ctx)
        self.global_state = global_state

    def wire(self, k):
        """The global state down, the client's state of the same tensors up."""
        state = state_bytes(self.global_state)
        return {("down", "params"): Wire(state), ("up", "params"): Wire(state)}

    def configure(self, round_, selected):
        return {k: [Payload("params", dict(self.global_state))] for k in selected}

    def mean_upload(self, uploads) -> dict[str, torch.Tensor]:
        ups = list(uploads.values())
        return weighted_average([u.payloads[0].arrays for u in ups], [u.kept["weight"] for u in ups])

    def aggregate(self, round_, uploads):
        self.global_state = self.mean_upload(uploads)

    def state_dict(self) -> dict:
        return {"global": {n: t.clone() for n, t in self.global_state.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.global_state = {n: t.clone() for n, t in state["global"].items()}
