"""FD with encoded payloads (`fd.encode_up`: each client's per-class mean logits; `fd.encode_down`: its class
teachers): the ledger counts the encoded parts exactly (what crossed, walked and serialized as .npy, equals it;
every row weighs what `wire` declares), each receiver holds what the encoding decodes to, the float32 default
sends what FD always sent, and a bad encoding is refused when params load, naming the key."""

from __future__ import annotations

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, record_uploads, run_tallied, trainer_for
from conftest import tiny_params_raw, unit_tier_first
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.encoding import row_bytes
from pipeline.methods.fd import method as fd
from pipeline.train.engine import Trainer

C = 10  # MNIST's classes


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, run: str, **codes) -> Trainer:
    return trainer_for(params, part, mnist, "fd", run, **codes)


# every encoding FD takes, each once up and once down
# the other encodings repeat the check (make test); each codec's own bytes: tests/test_encoding.py
@pytest.mark.parametrize("up, down", unit_tier_first([("float16", "int8"), ("int8", "topk:3"), ("topk:2", "argmax"),
                                                      ("argmax", "float16"), ("float32", "topk:9")]))
def test_encoded_bytes_are_counted_exactly(tiny_workspace, mnist, up, down):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "enc", encode_up=up, encode_down=down)
    crossed = run_tallied(trainer)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    sizes = {(d, kind): b for r in (1, 2) for _, _, d, kind, b, _ in trainer.ledger.rows(r)}
    assert set(sizes) == {("up", "class_logits"), ("down", "class_logits")}  # round 2 brought class teachers
    for k in range(3):  # the declared formula is the encoding's: an int64 id and an encoded row per held class
        held = int(trainer.server.classes[k].sum())
        assert trainer.server.wire(k)[("up", "class_logits")].unit == 8 + row_bytes(parse(up), C)
        assert [b for _, c, d, _, b, _ in trainer.ledger.rows(1) if c == k and d == "up"] == \
               [held * (8 + row_bytes(parse(up), C))]


def test_the_receivers_hold_what_int8_decodes_to(tiny_workspace, mnist, monkeypatch):
    """The server's class means and a client's class teachers are the int8 rows decoded: within half a step of the
    float32 rows the sender encoded, and not those rows."""
    encoded = []  # (rows as computed, what encode made of them), every call
    real = fd.encode

    def spy(spec, name, rows, *args, **kwargs):
        out = real(spec, name, rows, *args, **kwargs)
        encoded.append((rows.clone(), out))
        return out

    monkeypatch.setattr(fd, "encode", spy)
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "int8", encode_up="int8", encode_down="int8")
    uploads = record_uploads(trainer)
    run_tallied(trainer, rounds=1)  # round 1 has no class teachers yet: every encode was an upload
    server = trainer.server

    def near_but_not(decoded, rows, parts):
        half_step = parts["logits.step"][:, None] / 2
        assert ((decoded - rows).abs() <= half_step + 1e-6).all()
        assert not torch.equal(decoded, rows)

    assert len(encoded) == len(uploads) == 3
    for rows, enc in encoded:
        (k,) = [k for k, arrays in uploads.items() if arrays["logits.q"] is enc.parts["logits.q"]]
        ids = uploads[k]["class_ids"]
        assert torch.equal(server.means[k, ids], enc.decoded)  # what the server folds in
        near_but_not(server.means[k, ids], rows, enc.parts)

    encoded.clear()
    for k, client in enumerate(trainer.clients):
        (download,) = server.configure(2, [k])[k]
        (rows, enc) = encoded.pop()
        teacher = trainer.sim.local.begin(client, [download], 2)["teacher"]  # each sample's class teacher
        table = torch.full((C, C), float("nan"))
        table[download.arrays["class_ids"]] = enc.decoded
        assert torch.equal(teacher, table[client.y_train])  # what the client distils toward
        assert torch.equal(rows, fd.leave_one_out(server.means, server.held)[k, download.arrays["class_ids"]])
        near_but_not(enc.decoded, rows, enc.parts)


def test_float32_by_default_sends_what_fd_always_sent(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    assert (params.fd.encode_up, params.fd.encode_down) == ("float32", "float32")
    trainer = _trainer(params, part, mnist, "plain")
    uploads = record_uploads(trainer)
    run_tallied(trainer)
    for k, arrays in uploads.items():
        assert sorted(arrays) == ["class_ids", "logits"]
        assert arrays["class_ids"].dtype == torch.int64 and arrays["logits"].dtype == torch.float32
        assert torch.equal(trainer.server.means[k, arrays["class_ids"]], arrays["logits"])
        wire = trainer.server.wire(k)
        assert wire[("up", "class_logits")].unit == wire[("down", "class_logits")].unit == 8 + 4 * C


@pytest.mark.parametrize("section, match", [
    ({"encode_up": "topk:10"}, r"fd\.encode_up = 'topk:10': topk:10 keeps 10 of 10 values a row"),
    ({"encode_down": "int4"}, r"fd\.encode_down = 'int4'.*'int4' is not an encoding"),
    ({"encode_down": "delta:0.1"}, r"fd\.encode_down = 'delta:0.1'.*FD takes no delta encoding"),
    ({"encode_up": "delta:0+int8"}, r"fd\.encode_up = 'delta:0\+int8'.*FD takes no delta encoding"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_params(tiny_params_raw({"fd": section}), methods=("fd",))
