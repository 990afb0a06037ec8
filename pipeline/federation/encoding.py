"""Encoding and decoding a payload's rows (the encodings are described in pipeline/encoding_spec.py).

`encode` returns the parts that travel, which are what a Payload carries and so what the ledger counts (values,
steps, columns, bitmaps: never the decoded array), with what the receiver holds once it has decoded them: a sender
that encodes deltas keeps that as its copy of the receiver's. `decode` is the receiver's side. A payload may carry
several encoded arrays side by side (FedCache's sample ids travel as they are): parts are named after the array.

Counting is exact: every part is a plain array, and its bytes in numpy's .npy format are its nbytes after a header
of NPY_HEADER bytes (`npy_bytes` serializes them; the conformance suite compares the two).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.encoding_spec import FLOAT32, Spec

NPY_HEADER = 128  # numpy .npy format 1.0: magic, version, header length and the padded header dict of one array
HARD_LABEL_LOGIT = 10.0  # argmax decodes to a row of zeros with this at the label: softmax gives it >= 0.998 of 10
_BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)


@dataclass
class Encoded:
    parts: dict[str, torch.Tensor]  # what travels
    decoded: torch.Tensor  # what the receiver holds after decoding them


def row_bytes(spec: Spec, columns: int, fill: str = "logmeanexp") -> int | None:
    """What one row weighs encoded (float32 values as computed); None for delta, which depends on what moved."""
    if spec.kind == "delta":
        return None
    sizes = {"float32": 4 * columns, "float16": 2 * columns, "int8": columns + 8,
             "argmax": torch.tensor([], dtype=column_dtype(columns + 1)).element_size()}
    if spec.kind == "topk":
        return spec.kept(columns) * (4 + torch.tensor([], dtype=column_dtype(columns)).element_size()) + (
            4 if fill == "logmeanexp" else 0)
    return sizes[spec.kind]


def column_dtype(columns: int) -> torch.dtype:
    """The narrowest integer type that names a column."""
    return torch.uint8 if columns <= 256 else torch.int16 if columns <= 32768 else torch.int32


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """bool [n] -> uint8 [ceil(n / 8)], the first row in the highest bit of the first byte (numpy's packbits)."""
    padded = torch.zeros(math.ceil(len(mask) / 8) * 8, dtype=torch.uint8)
    padded[: len(mask)] = mask.to(torch.uint8)
    return (padded.view(-1, 8) * _BITS).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    return ((packed.unsqueeze(1) & _BITS) > 0).flatten()[:n]


def encode(spec: Spec, name: str, rows: torch.Tensor, held: torch.Tensor | None = None,
           fill: str = "logmeanexp") -> Encoded:
    """rows [n, d] (float) -> the parts that travel and the decoded rows. `held` [n, d]: what the receiver holds of
    these rows (delta only; NaN rows: nothing yet, always sent). `fill`: what top-k's dropped values decode to,
    "logmeanexp" (logits) or "zero" (model deltas, kept by magnitude)."""
    rows = rows.detach().cpu()
    n, d = rows.shape
    dtype = rows.dtype  # float32, or float64 where the equivalence tests run: "float32" sends it as computed
    if spec.kind == "float32":  # as they are: no copy on the default path (a receiver that keeps rows copies them)
        return Encoded({name: rows}, rows)
    if spec.kind == "float16":
        half = rows.half()
        return Encoded({name: half}, half.to(dtype))
    if spec.kind == "int8":
        low = (rows.amin(dim=1) if d else torch.zeros(n, dtype=dtype)).float()
        step = ((rows.amax(dim=1).float() - low) / 255 if d else torch.zeros(n))
        safe = torch.where(step > 0, step, torch.ones_like(step))
        codes = torch.round((rows.float() - low[:, None]) / safe[:, None]).clamp(0, 255)
        q = torch.nan_to_num(codes, nan=0.0).to(torch.uint8)  # a NaN row keeps NaN in its minimum
        return Encoded({f"{name}.q": q, f"{name}.min": low, f"{name}.step": step},
                       _dequantize(q, low, step).to(dtype))
    if spec.kind == "topk":
        key = rows if fill == "logmeanexp" else rows.abs()
        columns = key.topk(spec.kept(d), dim=1).indices.sort(dim=1).values
        values = rows.gather(1, columns)
        parts = {f"{name}.values": values, f"{name}.columns": columns.to(column_dtype(d))}
        if fill == "logmeanexp":
            dropped = rows.scatter(1, columns, float("-inf"))
            parts[f"{name}.rest"] = torch.logsumexp(dropped, dim=1) - math.log(d - spec.kept(d))
        return Encoded(parts, decode(spec, name, parts, columns=d, fill=fill).to(dtype))
    if spec.kind == "argmax":  # a row with a NaN (no value: e.g. a sample without a teacher) travels as column d
        labels = torch.where(torch.isnan(rows).any(dim=1), d, rows.argmax(dim=1))
        parts = {f"{name}.argmax": labels.to(column_dtype(d + 1))}
        return Encoded(parts, decode(spec, name, parts, columns=d).to(dtype))
    if spec.kind == "delta":
        if held is None:
            held = torch.full_like(rows, float("nan"))
        moved = ~((rows - held).abs() <= spec.threshold).all(dim=1)  # NaN (nothing held) compares False: sent
        inner = encode(spec.inner, name, rows[moved], fill=fill)
        decoded = held.clone()
        decoded[moved] = inner.decoded
        return Encoded({f"{name}.sent": pack_bits(moved), **inner.parts}, decoded)
    raise ValueError(f"unknown encoding {spec}")


def decode(spec: Spec, name: str, parts: dict[str, torch.Tensor], held: torch.Tensor | None = None,
           columns: int | None = None, fill: str = "logmeanexp") -> torch.Tensor:
    """The receiver's side of `encode`: the rows the parts stand for. `held` [n, d]: the receiver's copy (delta:
    unsent rows keep it); `columns`: d (top-k and argmax send fewer)."""
    if spec.kind == "float32":
        return parts[name]
    if spec.kind == "float16":
        return parts[name].float()
    if spec.kind == "int8":
        return _dequantize(parts[f"{name}.q"], parts[f"{name}.min"], parts[f"{name}.step"])
    if spec.kind == "topk":
        values, cols = parts[f"{name}.values"], parts[f"{name}.columns"].long()
        base = (parts[f"{name}.rest"][:, None].expand(len(values), columns) if fill == "logmeanexp"
                else torch.zeros(len(values), columns))
        return base.to(values.dtype).scatter(1, cols, values)
    if spec.kind == "argmax":
        labels = parts[f"{name}.argmax"].long()
        out = torch.zeros(len(labels), columns)
        known = labels < columns
        out[known.nonzero().flatten(), labels[known]] = HARD_LABEL_LOGIT
        out[~known] = float("nan")
        return out
    if spec.kind == "delta":
        moved = unpack_bits(parts[f"{name}.sent"], len(held))
        out = held.clone()
        inner = {k: v for k, v in parts.items() if k != f"{name}.sent"}
        out[moved] = decode(spec.inner, name, inner, columns=held.shape[1], fill=fill).to(out.dtype)
        return out
    raise ValueError(f"unknown encoding {spec}")


def _dequantize(q: torch.Tensor, low: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    return low[:, None] + q.float() * step[:, None]


def npy_bytes(array: torch.Tensor | np.ndarray) -> int:
    """The length of `array` written in numpy's .npy format: what a real serialization of the part weighs."""
    buffer = io.BytesIO()
    np.save(buffer, array.numpy() if isinstance(array, torch.Tensor) else array, allow_pickle=False)
    return buffer.tell()


__all__ = ["FLOAT32", "HARD_LABEL_LOGIT", "NPY_HEADER", "Encoded", "decode", "encode", "npy_bytes"]
