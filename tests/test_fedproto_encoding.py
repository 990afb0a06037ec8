"""FedProto with encoded prototypes (`fedproto.encode_up`: each client's, `fedproto.encode_down`: the global ones):
the ledger counts the encoded parts exactly (what crossed, walked and serialized as .npy, equals it; every row
weighs what `wire` declares), each receiver uses what it decoded, a lossless delta trains exactly as float32, the
float32 default sends what it always sent, and a bad encoding (or the old `compress` key) is refused naming the
key."""

from __future__ import annotations

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, run_tallied, trainer_for
from conftest import tiny_params_raw, unit_tier_first
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.encoding import decode
from pipeline.train.engine import Trainer

D = 64  # the prototype size: ResNet-8's feature size


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, run: str, **fedproto) -> Trainer:
    return trainer_for(params, part, mnist, "fedproto", run, **fedproto)


def _run(trainer: Trainer, rounds: int = 3) -> dict:
    """Three rounds: the first download comes in round 2, a delta's unsent rows show from round 3."""
    return run_tallied(trainer, rounds)


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [t.clone() for c in trainer.clients for t in c.model.state_dict().values()]


def _held(trainer: Trainer) -> list[int]:
    return [len(c.y_train.unique()) for c in trainer.clients]


# the other encodings repeat the check (make test); each codec's own bytes: tests/test_encoding.py
@pytest.mark.parametrize("up, down", unit_tier_first([("float16", "int8"), ("int8", "topk:8"), ("topk:8", "float16"),
                                                      ("delta:0.05+int8", "delta:0.05+float16"),
                                                      ("delta:0", "float32")]))
def test_encoded_prototypes_are_counted_exactly(tiny_workspace, mnist, up, down):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "enc", encode_up=up, encode_down=down, aggregation="confidence")
    crossed = _run(trainer)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)


@pytest.mark.slow  # a run for each encoding (the unit tier keeps the prototypes counted exactly): the end-to-end tier
def test_the_declared_formula_is_what_the_encodings_weigh(tiny_workspace, mnist):
    """int8 up: per class its id and count, D bytes and the prototype's minimum and step; float16 down: per global
    class its id and 2 bytes a value; topk:8 (fill zero, uint8 columns): 8 float32 values and their columns."""
    _, params, part = tiny_workspace
    for up, down, up_row, down_row in (("int8", "float16", D + 8, 2 * D), ("topk:8", "topk:8", 8 * 5, 8 * 5)):
        trainer = _trainer(params, part, mnist, f"{up}-{down}", encode_up=up, encode_down=down)
        _run(trainer, rounds=2)
        classes = len(torch.cat([c.y_train for c in trainer.clients]).unique())
        for k, held in enumerate(_held(trainer)):
            rows = {(d, kind): b for _, c, d, kind, b, _ in trainer.ledger.rows(2) if c == k}
            assert rows[("up", "prototypes")] == held * (8 + 8 + up_row)
            assert rows[("down", "prototypes")] == classes * (8 + down_row)
    # a delta nothing moves by: only the ids (and counts) and a bit a row, once the receiver holds every row
    wide = _trainer(params, part, mnist, "wide", encode_up="delta:1e9", encode_down="delta:1e9+int8")
    _run(wide)
    for k, held in enumerate(_held(wide)):
        rows = {(r, d, kind): b for r in (1, 2, 3) for _, c, d, kind, b, _ in wide.ledger.rows(r) if c == k}
        assert rows[(1, "up", "prototypes")] == held * (8 + 8 + 4 * D) + -(-held // 8)  # nothing held yet: all sent
        assert rows[(2, "up", "prototypes")] == rows[(3, "up", "prototypes")] == held * (8 + 8) + -(-held // 8)
        assert rows[(2, "down", "prototypes")] == classes * (8 + D + 8) + -(-classes // 8)
        assert rows[(3, "down", "prototypes")] == classes * 8 + -(-classes // 8)


def _capture(trainer: Trainer) -> dict[str, list]:
    """Every upload the server receives and every download a client receives, as they crossed."""
    sim, seen = trainer.sim, {"up": [], "down": []}
    deliver, receive = sim.deliver, sim.receive

    def seen_deliver(round_, client, payloads, at=None):
        seen["down"] += [(client, p) for p in payloads]
        return deliver(round_, client, payloads, at)

    def seen_receive(round_, client, upload, at=None):
        seen["up"] += [(client, p) for p in upload.payloads if p.kind == "prototypes"]
        return receive(round_, client, upload, at)

    sim.deliver, sim.receive = seen_deliver, seen_receive
    return seen


def test_each_receiver_uses_the_prototypes_it_decoded(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "decoded", encode_up="int8", encode_down="topk:8")
    seen = _capture(trainer)
    _run(trainer, rounds=2)
    up, down = parse("int8"), parse("topk:8")
    server = trainer.server
    for k, payload in dict(seen["up"]).items():  # each client's latest upload: what the server holds of it
        ids = payload.arrays["class_ids"]
        assert "prototypes" not in payload.arrays and payload.arrays["prototypes.q"].dtype == torch.uint8
        assert torch.equal(server.protos[k, ids], decode(up, "prototypes", payload.arrays, columns=D))
    # a client pulls toward the global prototypes it decoded: 8 values of each, the rest 0
    client, payload = seen["down"][-1]
    c = trainer.clients[client]
    targets = trainer.sim.local.begin(c, [payload], 3)
    table = decode(down, "prototypes", payload.arrays, columns=D, fill="zero")
    ids = payload.arrays["class_ids"]
    expect = torch.zeros(10, D)
    expect[ids] = table
    assert torch.equal(targets["prototype"].cpu(), expect[c.y_train.cpu()])
    assert ((targets["prototype"] != 0).sum(dim=1) <= 8).all()


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_a_delta_keeps_the_same_copy_on_both_sides_and_a_lossless_one_trains_as_float32(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    lossy = _trainer(params, part, mnist, "lossy", encode_up="delta:0.05+int8", encode_down="delta:0.05+float16")
    _run(lossy)
    for c in lossy.clients:  # what each sender believes its receiver holds is what the receiver holds
        mine = c.y_train.unique().cpu()
        assert torch.equal(c.state["sent_copy"][mine], lossy.server.protos[c.id, mine])
        torch.testing.assert_close(c.state["global_copy"], lossy.server.sent[c.id], rtol=0, atol=0, equal_nan=True)
    plain = _trainer(params, part, mnist, "plain")
    _run(plain)
    exact = _trainer(params, part, mnist, "exact", encode_up="delta:0", encode_down="delta:0")
    _run(exact)
    for a, b in zip(_weights(plain), _weights(exact)):
        assert torch.equal(a, b)


def test_the_float32_default_sends_the_plain_prototypes(tiny_workspace, mnist):
    """What every run sent before the encodings: the [c, D] float32 matrix, c * (8 + 8 + 4D) bytes up."""
    _, params, part = tiny_workspace
    assert (params.fedproto.encode_up, params.fedproto.encode_down) == ("float32", "float32")
    trainer = _trainer(params, part, mnist, "default")
    seen = _capture(trainer)
    _run(trainer, rounds=2)
    for k, payload in seen["up"]:
        assert set(payload.arrays) == {"class_ids", "counts", "prototypes"}
        assert payload.arrays["prototypes"].dtype == torch.float32
    for k, held in enumerate(_held(trainer)):
        rows = {(d, kind): b for _, c, d, kind, b, _ in trainer.ledger.rows(2) if c == k}
        assert rows[("up", "prototypes")] == held * (8 + 8 + 4 * D)


@pytest.mark.parametrize("section, match", [
    ({"encode_up": "argmax"}, r"fedproto\.encode_up = 'argmax': a prototype's values are features"),
    ({"encode_down": "int4"}, r"fedproto\.encode_down.*'int4' is not an encoding"),
    ({"align": True, "align_dim": 16, "encode_down": "topk:16"}, r"fedproto\.encode_down = 'topk:16': topk:16 keeps 16 "
                                                                 r"of 16 values a row"),
    ({"compress": True}, r"fedproto\.compress was replaced by fedproto\.encode_up"),
    ({"compress": True, "topk_fraction": 0.25}, r"fedproto\.compress was replaced by fedproto\.encode_up"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_params(tiny_params_raw({"fedproto": section}), methods=("fedproto",))


def test_a_params_file_that_turned_the_old_compression_off_still_loads():
    params = parse_params(tiny_params_raw({"fedproto": {"compress": False, "topk_fraction": 0.1}}),
                          methods=("fedproto",))
    assert params.fedproto.encode_up == "float32"
    assert "compress" not in params.fedproto.model_dump()


def test_a_topk_as_wide_as_the_features_is_refused_before_training(tiny_workspace, mnist):
    """Without align the prototype size is the clients' feature size, known once their models are."""
    _, params, part = tiny_workspace
    with pytest.raises(ConfigError, match=r"fedproto\.encode_up = 'topk:64': topk:64 keeps 64 of 64 values"):
        _trainer(params, part, mnist, "wide", encode_up="topk:64")


def test_a_delta_is_refused_where_the_simulated_clock_can_drop_a_message():
    train = {"algorithms": ["fedproto"], "schedule": "deadline", "deadline_quantile": 0.8}
    with pytest.raises(ConfigError, match=r"fedproto\.encode_up = 'delta:0\.1'.*dropped by the simulated clock"):
        parse_params(tiny_params_raw({"fedproto": {"encode_up": "delta:0.1"}, "train": train,
                                      "devices": {"enabled": True}}), methods=("fedproto",))
