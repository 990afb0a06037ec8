"""Payload encodings (pipeline/encoding_spec.py, pipeline/federation/encoding.py): each round-trips within its
stated error, what travels is counted exactly (the parts' nbytes are their .npy serialization less its header), and
the receiver decodes to exactly the copy the sender keeps of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.encoding_spec import check_columns, parse
from pipeline.federation.encoding import (HARD_LABEL_LOGIT, NPY_HEADER, decode, encode, npy_bytes, pack_bits,
                                          row_bytes, unpack_bits)

SPECS = ["float32", "float16", "int8", "topk:1", "topk:3", "argmax", "delta:0", "delta:0.5", "delta:0.5+int8",
         "delta:0+float16"]


def _logits(n: int = 37, c: int = 10, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g) * 4


@pytest.mark.parametrize("text", SPECS)
def test_a_spec_reads_back_as_written(text):
    assert str(parse(text)) == text


@pytest.mark.parametrize("text, message", [
    ("float64", "not an encoding"), ("topk", "topk needs how many"), ("topk:0", "topk needs how many"),
    ("topk:2.5", "topk needs how many"), ("argmax:3", "takes no argument"), ("delta", "delta needs a threshold"),
    ("delta:-1", "delta needs a threshold"), ("delta:nan", "delta needs a threshold"),
    ("delta:0.1+topk:2", "travel as one of float32, float16, int8"), (3, "is a string")])
def test_a_bad_spec_says_what_is_allowed(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


def test_topk_must_drop_something():
    assert "K must be below 10" in check_columns(parse("topk:10"), 10)
    assert check_columns(parse("topk:9"), 10) is None and check_columns(parse("int8"), 2) is None


@pytest.mark.parametrize("text", SPECS)
def test_what_travels_is_counted_exactly_and_decodes_to_the_senders_copy(text):
    spec, rows = parse(text), _logits()
    held = rows.clone()
    held[::3] += 1.0  # a third of the rows moved by 1 since the receiver's copy; two thirds did not
    enc = encode(spec, "logits", rows, held=held)
    for name, part in enc.parts.items():  # every part is a plain array, serialized as it is counted
        assert npy_bytes(part) - NPY_HEADER == part.numel() * part.element_size(), name
    received = decode(spec, "logits", enc.parts, held=held, columns=rows.shape[1])
    assert torch.equal(received, enc.decoded)  # the sender's copy of the receiver's is what the receiver holds


def _counted(enc) -> int:
    return sum(p.numel() * p.element_size() for p in enc.parts.values())


def test_each_encoding_weighs_what_the_docs_say():
    n, c = 37, 10
    rows = _logits(n, c)
    assert _counted(encode(parse("float32"), "x", rows)) == n * c * 4
    assert _counted(encode(parse("float16"), "x", rows)) == n * c * 2
    assert _counted(encode(parse("int8"), "x", rows)) == n * c + n * 8  # codes, and each row's minimum and step
    assert _counted(encode(parse("topk:3"), "x", rows)) == n * (3 * 4 + 3 + 4)  # values, columns, the rest
    assert _counted(encode(parse("topk:3"), "x", rows, fill="zero")) == n * (3 * 4 + 3)
    assert _counted(encode(parse("argmax"), "x", rows)) == n
    held = rows.clone()
    held[:5] += 1
    assert _counted(encode(parse("delta:0"), "x", rows, held=held)) == math.ceil(n / 8) + 5 * c * 4
    assert _counted(encode(parse("delta:0"), "x", rows)) == math.ceil(n / 8) + n * c * 4  # nothing held: all sent


def test_float32_and_delta_0_are_exact_float16_and_int8_within_their_bounds():
    rows = _logits(200)
    assert torch.equal(encode(parse("float32"), "x", rows).decoded, rows)
    held = rows.clone()
    held[1::2] = float("nan")  # the receiver holds half the rows
    assert torch.equal(encode(parse("delta:0"), "x", rows, held=held).decoded, rows)
    half = encode(parse("float16"), "x", rows).decoded
    assert ((half - rows).abs() <= rows.abs() * 2.0 ** -11).all()
    q = encode(parse("int8"), "x", rows).decoded
    bound = (rows.amax(dim=1) - rows.amin(dim=1)) / 510
    assert ((q - rows).abs() <= bound[:, None] * (1 + 1e-5) + 1e-6).all()
    assert ((q - rows).abs() > 0).any()  # lossy: the check above could fail
    constant = torch.full((3, 10), 2.5)  # a flat row: step 0, decoded exactly
    assert torch.equal(encode(parse("int8"), "x", constant).decoded, constant)


def test_topk_keeps_its_values_exactly_and_the_dropped_keep_their_share_of_the_mass():
    rows = _logits(50)
    dec = encode(parse("topk:3"), "x", rows).decoded
    top = rows.topk(3, dim=1)
    assert torch.equal(dec.gather(1, top.indices), top.values)  # the kept entries, exact
    dropped = torch.ones_like(rows, dtype=torch.bool).scatter(1, top.indices, False)
    # at temperature 1 the dropped classes share the probability mass they had, equally
    p, p_dec = torch.softmax(rows, dim=1), torch.softmax(dec, dim=1)
    torch.testing.assert_close((p_dec * dropped).sum(dim=1), (p * dropped).sum(dim=1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(p_dec.gather(1, top.indices), p.gather(1, top.indices), rtol=1e-5, atol=1e-6)
    deltas = torch.randn(20, 30)
    kept = encode(parse("topk:4"), "x", deltas, fill="zero").decoded
    by_size = deltas.abs().topk(4, dim=1).indices
    assert torch.equal(kept.gather(1, by_size), deltas.gather(1, by_size)) and (kept != 0).sum() == 20 * 4


def test_argmax_is_the_hard_label():
    rows = _logits(40)
    dec = encode(parse("argmax"), "x", rows).decoded
    assert torch.equal(dec.argmax(dim=1), rows.argmax(dim=1))
    assert set(dec.unique().tolist()) == {0.0, HARD_LABEL_LOGIT}


def test_delta_sends_only_the_rows_that_moved_more_than_its_threshold():
    rows = _logits(16)
    held = rows.clone()
    held[3] += 0.4  # moved by 0.4: under the threshold, kept as held
    held[7] -= 0.6  # moved by 0.6: sent
    enc = encode(parse("delta:0.5"), "x", rows, held=held)
    assert unpack_bits(enc.parts["x.sent"], 16).nonzero().flatten().tolist() == [7]
    assert enc.parts["x"].shape == (1, 10)
    assert torch.equal(enc.decoded[7], rows[7]) and torch.equal(enc.decoded[3], held[3])
    assert ((enc.decoded - rows).abs() <= 0.5).all()


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 100])
def test_the_bitmap_is_numpys_packbits(n):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.5
    packed = pack_bits(mask)
    assert packed.numpy().tobytes() == np.packbits(mask.numpy()).tobytes()
    assert torch.equal(unpack_bits(packed, n), mask)


def test_float64_rows_stay_float64_where_the_encoding_is_exact():
    rows = _logits(5).double()
    assert encode(parse("float32"), "x", rows).decoded.dtype == torch.float64
    assert encode(parse("int8"), "x", rows).decoded.dtype == torch.float64


@pytest.mark.parametrize("text", ["float32", "float16", "int8", "topk:3", "argmax"])
def test_a_row_with_no_value_stays_so_and_rows_weigh_what_row_bytes_says(text):
    rows = _logits(6)
    rows[2] = float("nan")  # e.g. a sample without a teacher
    enc = encode(parse(text), "x", rows)
    assert torch.isnan(enc.decoded[2]).all() and not torch.isnan(enc.decoded[[0, 1, 3, 4, 5]]).any()
    assert _counted(enc) == 6 * row_bytes(parse(text), 10)
    assert row_bytes(parse("delta:0"), 10) is None


def test_the_class_counts_params_check_against_are_the_datasets():
    from pipeline.config import NUM_CLASSES
    from pipeline.data.datasets import CIFAR10_CLASSES, FASHION_MNIST_CLASSES, MNIST_CLASSES

    assert NUM_CLASSES == {"fashion_mnist": len(FASHION_MNIST_CLASSES), "mnist": len(MNIST_CLASSES),
                           "cifar10": len(CIFAR10_CLASSES)}


# -- topk:F, a fraction of each row (model changes send a whole tensor as one row: pipeline/federation/averaging.py)

@pytest.mark.parametrize("text, fraction", [("topk:0.01", 0.01), ("topk:0.5", 0.5), ("topk:1e-05", 1e-05)])
def test_a_fraction_spec_reads_back_as_written(text, fraction):
    spec = parse(text)
    assert (spec.kind, spec.k, spec.fraction, str(spec)) == ("topk", None, fraction, text)
    assert str(parse(text.replace("0.5", ".5"))) == text  # written canonically


@pytest.mark.parametrize("text", ["topk:1.0", "topk:1.5", "topk:-0.1", "topk:nan", "topk:inf", "topk:0.0", "topk:x"])
def test_a_fraction_outside_0_to_1_is_refused_saying_what_is_allowed(text):
    with pytest.raises(ValueError, match=r"topk needs .* or the fraction of them, between 0 and 1"):
        parse(text)


def test_a_fraction_keeps_round_f_times_the_columns_and_at_least_one():
    spec = parse("topk:0.01")
    assert [spec.kept(n) for n in (1, 10, 49, 51, 300, 4608)] == [1, 1, 1, 1, 3, 46]
    assert parse("topk:3").kept(4608) == 3  # a count is a count
    assert check_columns(parse("topk:0.5"), 10) is None
    assert "topk:0.95 keeps 10 of 10 values a row: F * 10 must round below 10" in check_columns(parse("topk:0.95"), 10)


@pytest.mark.parametrize("columns", [10, 300, 40000])  # columns named by uint8, int16 and int32
def test_a_fraction_row_weighs_what_row_bytes_says_and_keeps_the_largest(columns):
    spec = parse("topk:0.01")
    deltas = torch.randn(2, columns, generator=torch.Generator().manual_seed(columns))
    enc = encode(spec, "x", deltas, fill="zero")
    assert _counted(enc) == 2 * row_bytes(spec, columns, fill="zero")
    k = spec.kept(columns)
    by_size = deltas.abs().topk(k, dim=1).indices
    assert torch.equal(enc.decoded.gather(1, by_size), deltas.gather(1, by_size)) and (enc.decoded != 0).sum() == 2 * k
    assert torch.equal(decode(spec, "x", enc.parts, columns=columns, fill="zero"), enc.decoded)
