"""FedDKC and FedICT with encoded payloads (`<method>.encode_up`: each client's stem features, a row per feature map,
and its logits, a row per sample; `<method>.encode_down`: the server's logits), built once into their shared base
(pipeline/federation/gkt.py): the ledger counts the encoded parts exactly (what crossed, walked and serialized as
.npy, equals it; every row weighs what `wire` declares), each receiver trains on what the encoding decodes to, the
float32 default sends what they always sent, and a bad encoding is refused when params load, naming the key."""

from __future__ import annotations

import pytest
import torch

from boundary import (assert_ledger_follows_the_declared_formula, record_uploads, run_tallied, tally_the_boundary,
                      trainer_for)
from conftest import tiny, tiny_params_raw, unit_tier_first
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation import gkt
from pipeline.federation.encoding import row_bytes
from pipeline.train.engine import Trainer

C, MAPS = 10, 16  # MNIST's classes; the stem's feature maps a sample
METHODS = ["feddkc", "fedict"]


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, method: str, run: str, **codes) -> Trainer:
    return trainer_for(tiny(params, method), part, mnist, method, run, **codes)


def _assert_counted_exactly(trainer: Trainer, crossed: dict, up: str, down: str, pixels: int) -> None:
    """The ledger counts what crossed, and every row weighs the encoding's formula: 16 feature-map rows, a logits row
    and an int64 label a sample up, a logits row a sample down."""
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    for k in range(3):
        wire = trainer.server.wire(k)
        assert wire[("up", "features")].unit == (MAPS * row_bytes(parse(up), pixels, fill="zero")
                                                 + row_bytes(parse(up), C) + 8)
        assert wire[("down", "server_logits")].unit == row_bytes(parse(down), C)
    down_rows = [b for _, _, d, _, b, _ in trainer.ledger.rows(2) if d == "down"]
    assert len(down_rows) == 3 and all(down_rows)  # round 2 brought the server's logits


# every encoding each direction takes, with int8 both ways in the test after this one
@pytest.mark.parametrize("method", METHODS)
# the other encodings repeat the check (make test); each codec's own bytes: tests/test_encoding.py
@pytest.mark.parametrize("up, down", unit_tier_first([("float16", "float16"), ("topk:0.3", "topk:3"),
                                                      ("float32", "argmax")]))
def test_encoded_bytes_are_counted_exactly(tiny_workspace, mnist, method, up, down):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, method, f"{method}-enc", encode_up=up, encode_down=down)
    uploads = record_uploads(trainer)
    crossed = run_tallied(trainer)
    pixels = mnist.input_shape[1] * mnist.input_shape[2]  # a feature map is the image's size (a stride-1 stem)
    _assert_counted_exactly(trainer, crossed, up, down, pixels)
    if up == "float32":  # what the uploads always were
        for k, arrays in uploads.items():
            n = trainer.clients[k].num_train
            assert {a: (t.dtype, t.numel()) for a, t in arrays.items()} == {
                "features": (torch.float32, n * MAPS * pixels), "logits": (torch.float32, n * C),
                "labels": (torch.int64, n)}


@pytest.mark.parametrize("method", METHODS)
def test_the_receivers_train_on_what_int8_decodes_to(tiny_workspace, mnist, monkeypatch, method):
    """The server model reads each client's int8 features and logits decoded, and a client distils toward the
    server's int8 logits decoded: within half a step of the float32 rows the sender encoded, and not those rows."""
    encoded = []  # (array name, rows as computed, what encode made of them), every call
    real = gkt.encode

    def spy(spec, name, rows, *args, **kwargs):
        out = real(spec, name, rows, *args, **kwargs)
        encoded.append((name, rows.clone(), out))
        return out

    monkeypatch.setattr(gkt, "encode", spy)
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, method, f"{method}-int8", encode_up="int8", encode_down="int8")
    server = trainer.server
    folded = {}  # what the server's training reads of each upload
    begin_aggregate = server.begin_aggregate
    server.begin_aggregate = lambda arrays: (folded.update(arrays), begin_aggregate(arrays))
    uploads = record_uploads(trainer)
    crossed = tally_the_boundary(trainer)
    trainer.start()
    trainer.run_round(1)  # no download in round 1: every encode was an upload's

    def near_but_not(decoded, rows, parts, name):
        assert ((decoded - rows).abs() <= parts[f"{name}.step"][:, None] / 2 + 1e-6).all()
        assert not torch.equal(decoded, rows)

    assert len(encoded) == 2 * len(uploads) == 6
    for name, rows, enc in encoded:
        (k,) = [k for k, arrays in uploads.items() if arrays[f"{name}.q"] is enc.parts[f"{name}.q"]]
        got = folded[k][name].reshape(len(rows), -1)  # features: a row per feature map
        assert torch.equal(got, enc.decoded)
        near_but_not(got, rows, enc.parts, name)

    trainer.run_round(2)
    _assert_counted_exactly(trainer, crossed, "int8", "int8", mnist.input_shape[1] * mnist.input_shape[2])
    encoded.clear()
    for k, client in enumerate(trainer.clients):
        (download,) = server.configure(3, [k])[k]
        ((name, rows, enc),) = encoded
        encoded.clear()
        assert name == "logits" and torch.equal(rows, server.knowledge[k])
        teacher = trainer.sim.local.begin(client, [download], 3)["teacher"]
        assert torch.equal(teacher, enc.decoded)  # what the client distils toward
        near_but_not(teacher, rows, enc.parts, name)


@pytest.mark.parametrize("method", METHODS)
def test_float32_is_the_default_and_declares_what_they_always_sent(tiny_workspace, mnist, method):
    _, params, part = tiny_workspace
    assert (getattr(params, method).encode_up, getattr(params, method).encode_down) == ("float32", "float32")
    pixels = mnist.input_shape[1] * mnist.input_shape[2]
    server = _trainer(params, part, mnist, method, f"{method}-plain").server
    for k in range(3):
        wire = server.wire(k)
        assert wire[("up", "features")].unit == 4 * MAPS * pixels + 4 * C + 8
        assert wire[("down", "server_logits")].unit == 4 * C


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("section, match", [
    ({"encode_down": "topk:10"}, r"{m}\.encode_down = 'topk:10': topk:10 keeps 10 of 10 values a row"),
    ({"encode_up": "topk:12"}, r"{m}\.encode_up = 'topk:12': topk:12 keeps 12 of 10 values a row"),
    ({"encode_up": "int4"}, r"{m}\.encode_up = 'int4'.*'int4' is not an encoding"),
    ({"encode_up": "argmax"}, r"{m}\.encode_up = 'argmax'.*says nothing of a feature map"),
    ({"encode_up": "delta:0.1"}, r"{m}\.encode_up = 'delta:0.1'.*no delta encoding here"),
    ({"encode_down": "delta:0+int8"}, r"{m}\.encode_down = 'delta:0\+int8'.*no delta encoding here"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(method, section, match):
    with pytest.raises(ConfigError, match=match.format(m=method)):
        parse_params(tiny_params_raw({method: section}), methods=(method,))
