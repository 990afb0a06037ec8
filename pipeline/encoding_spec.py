"""Payload encodings as params name them (e.g. `fedcache.encode_up: int8`), parsed and checked without torch.

An encoding says how the rows of a payload's array travel (pipeline/federation/encoding.py encodes and decodes):

  float32        as computed: 4 bytes a value (the default, what every method sent before encodings)
  float16        2 bytes a value; relative error at most 2**-11 for values in float16's normal range
  int8           per row, one byte a value plus the row's minimum and step (float32 each): a value is off by at
                 most half a step, (max - min) / 510
  topk:K         per row, its K largest values (float32) and their columns (uint8 up to 256 columns, else int16,
                 int32 beyond 32768), plus one float32 for the dropped ones: logits decode them to the
                 log-mean-exp of what was dropped (so at temperature 1 they keep their share of the probability
                 mass); deltas to 0
  topk:F         (0 < F < 1) the same with a fraction of each row: K = round(F * columns), at least 1. A model's
                 change is sent a whole tensor as one row (pipeline/federation/averaging.py), so topk:0.01 keeps
                 1% of each tensor's entries, the largest in magnitude
  argmax         per row, the column of its largest value (uint8 up to 256 columns): a hard label
  delta:T        per row, sent only when it moved by more than T (largest absolute change) from what the receiver
  delta:T+E      holds, encoded with E (float32, float16 or int8; float32 when not given), after a bitmap of
                 which rows were sent (one bit a row); T = 0 sends every row that changed, exactly with float32.
                 The sender keeps the receiver's copy (as decoded), so an unsent row costs one bit.
"""

from __future__ import annotations

from dataclasses import dataclass

BASIC = ("float32", "float16", "int8")
KINDS = (*BASIC, "topk", "argmax", "delta")


@dataclass(frozen=True)
class Spec:
    """A parsed encoding: its kind, and topk's K (or fraction), delta's threshold and inner encoding."""

    kind: str
    k: int | None = None
    threshold: float | None = None
    inner: Spec | None = None
    fraction: float | None = None  # topk:F, 0 < F < 1: the share of a row's values kept (k is None then)

    def __str__(self) -> str:
        if self.kind == "topk":
            return f"topk:{self.k}" if self.fraction is None else f"topk:{self.fraction:g}"
        if self.kind == "delta":
            return f"delta:{self.threshold:g}" + ("" if self.inner is None or self.inner.kind == "float32"
                                                  else f"+{self.inner.kind}")
        return self.kind

    @property
    def lossless(self) -> bool:
        """Decodes to exactly what was encoded (float32, and delta:0 over float32)."""
        return self.kind == "float32" or (self.kind == "delta" and self.threshold == 0 and self.inner.kind == "float32")

    def kept(self, columns: int) -> int:
        """How many values of a row of `columns` top-k keeps: K, or round(F * columns) and at least 1."""
        return self.k if self.fraction is None else max(1, round(self.fraction * columns))


FLOAT32 = Spec("float32")


def parse(text: str) -> Spec:
    """'int8', 'topk:3', 'delta:0.05+int8', ... -> Spec; a ValueError that says what is allowed otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"an encoding is a string such as 'float16' (got {text!r})")
    kind, _, arg = text.strip().partition(":")
    if kind in BASIC or kind == "argmax":
        if arg:
            raise ValueError(f"{text!r}: {kind} takes no argument")
        return Spec(kind)
    if kind == "topk":
        if arg.isdigit() and int(arg) >= 1:
            return Spec("topk", k=int(arg))
        try:
            fraction = float(arg)
        except ValueError:
            fraction = 0.0
        if not 0 < fraction < 1:
            raise ValueError(f"{text!r}: topk needs how many values a row keeps, a whole number >= 1 (e.g. topk:3), "
                             "or the fraction of them, between 0 and 1 (e.g. topk:0.01)")
        return Spec("topk", fraction=fraction)
    if kind == "delta":
        threshold, _, inner = arg.partition("+")
        try:
            t = float(threshold)
        except ValueError:
            t = -1.0
        if not threshold or not t >= 0 or t == float("inf"):
            raise ValueError(f"{text!r}: delta needs a threshold >= 0, the change below which a row is not sent "
                             "(e.g. delta:0.05, or delta:0.05+int8)")
        if inner and inner not in BASIC:
            raise ValueError(f"{text!r}: a delta's rows travel as one of {', '.join(BASIC)} (got {inner!r})")
        return Spec("delta", threshold=t, inner=Spec(inner or "float32"))
    raise ValueError(f"{text!r} is not an encoding: one of float32, float16, int8, topk:K, topk:F, argmax, delta:T[+E]")


def check_columns(spec: Spec, columns: int) -> str | None:
    """Why `spec` cannot encode rows of `columns` values (None: it can): top-k must drop something."""
    if spec.kind == "topk" and spec.kept(columns) >= columns:
        bound = f"K must be below {columns}" if spec.fraction is None else f"F * {columns} must round below {columns}"
        return f"{spec} keeps {spec.kept(columns)} of {columns} values a row: {bound} (or use float32)"
    return None
