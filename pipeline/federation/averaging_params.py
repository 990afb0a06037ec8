"""The encoding knobs the parameter-averaging methods share (FedAvg, MTFL, pFedMe, FedAlt; their states travel
through pipeline/federation/averaging.py).

Down goes a state (the global model, or FedAlt's blocks of it): float32, float16 or int8 per tensor row. Up goes
the client's change to it, which may also be sparsified: topk:F keeps the fraction F of each tensor's entries, the
largest in magnitude, and the client carries what it did not send into its next change (error feedback). A count
per row (topk:K) is refused: a model tensor's rows are not payload rows of comparable values.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator

from pipeline.config import MethodParams
from pipeline.encoding_spec import BASIC
from pipeline.encoding_spec import parse as parse_encoding


def _state_down(text: str) -> str:
    spec = parse_encoding(text)
    if spec.kind not in BASIC:  # top-k would zero most of a model's weights: it sparsifies changes (encode_up)
        raise ValueError(f"{text!r}: a model state travels down as one of {', '.join(BASIC)}"
                         + (" (topk:F sparsifies the clients' changes up: encode_up)" if spec.kind == "topk" else ""))
    return str(spec)


def _state_up(text: str) -> str:
    spec = parse_encoding(text)
    if spec.kind in BASIC or (spec.kind == "topk" and spec.fraction is not None):
        return str(spec)
    raise ValueError(f"{text!r}: a client's change travels up as one of {', '.join(BASIC)}, or topk:F with F the "
                     "fraction of each tensor's entries it keeps, between 0 and 1 (e.g. topk:0.01)")


StateDown = Annotated[str, AfterValidator(_state_down)]
StateUp = Annotated[str, AfterValidator(_state_up)]


class AveragingParams(MethodParams):
    """A parameter-averaging method's section: how its states travel (its own knobs in its subclass)."""

    class_rows: ClassVar[tuple[str, ...]] = ()  # a state's rows are tensor rows, not one value per class

    # the global state down: float32 (as computed) | float16 | int8 (a byte a value, a minimum and step per tensor
    # row); each client's change to it up: the same, or topk:F (the fraction F of each tensor's entries, error
    # feedback carrying the rest to the next round)
    encode_down: StateDown = "float32"
    encode_up: StateUp = "float32"
