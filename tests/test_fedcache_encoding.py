"""FedCache with encoded payloads (`fedcache.encode_up`, `fedcache.encode_down`): the ledger counts the encoded
parts exactly (what crossed, walked and serialized as .npy, equals it; every row weighs what `wire` declares), a
lossless delta trains exactly as float32 does, a delta sends only what moved, and a bad encoding is refused when
params load, naming the key."""

from __future__ import annotations

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, run_tallied, trainer_for
from conftest import tiny, tiny_params_raw, unit_tier_first, with_section
from pipeline import paths
from pipeline.config import ConfigError, parse_params
from pipeline.train.engine import Trainer


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, run: str, **fedcache) -> Trainer:
    return trainer_for(tiny(params, "fedcache"), part, mnist, "fedcache", run, **fedcache)


def _weights(trainer: Trainer) -> list[torch.Tensor]:
    return [t.clone() for c in trainer.clients for t in c.model.state_dict().values()]


# the other encodings repeat the check (make test); each codec's own bytes: tests/test_encoding.py
@pytest.mark.parametrize("up, down", unit_tier_first([("float16", "int8"), ("int8", "topk:3"), ("topk:2", "argmax"),
                                                      ("delta:0.5+int8", "delta:0.5+float16"), ("argmax", "float32")]))
def test_encoded_bytes_are_counted_exactly_in_round_consistency(tiny_workspace, mnist, up, down):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "enc", encode_up=up, encode_down=down)
    crossed = run_tallied(trainer)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    kinds = {kind for r in trainer.ledger.counts for (_, _, kind, _) in trainer.ledger.counts[r]}
    assert kinds == {"hashes", "logits", "knowledge"}


@pytest.mark.parametrize("consistency, executor", [("step", "vectorized"), ("live", "sequential")])
def test_per_batch_exchange_carries_encoded_rows(tiny_workspace, mnist, consistency, executor):
    _, params, part = tiny_workspace
    params = with_section(params, "train", executor=executor)
    trainer = _trainer(params, part, mnist, consistency, consistency=consistency, encode_up="int8",
                       encode_down="topk:2")
    crossed = run_tallied(trainer, rounds=1)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)


@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_a_lossless_delta_trains_exactly_as_float32_and_a_wide_one_sends_only_ids_and_bitmaps(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    plain = _trainer(params, part, mnist, "plain")
    run_tallied(plain)
    exact = _trainer(params, part, mnist, "exact", encode_up="delta:0", encode_down="delta:0")
    run_tallied(exact)
    for a, b in zip(_weights(plain), _weights(exact)):
        assert torch.equal(a, b)  # the receivers rebuilt every row bit for bit from what changed
    wide = _trainer(params, part, mnist, "wide", encode_up="delta:1e9", encode_down="delta:1e9")
    run_tallied(wide, rounds=3)
    C, sizes = 10, [c.num_train for c in wide.clients]
    for k, n in enumerate(sizes):  # nothing moves by 1e9: no logits travel after round 1, no teacher after the
        # round it first exists in (round 2: round 1's download had none, as the cache was empty)
        rows = {(r, d, kind): b for r in (2, 3) for _, c, d, kind, b, _ in wide.ledger.rows(r) if c == k}
        assert rows[(2, "up", "logits")] == rows[(3, "up", "logits")] == 8 * n + -(-n // 8)  # ids, a bit a row
        assert rows[(3, "down", "knowledge")] == -(-n // 8)
        assert rows[(2, "down", "knowledge")] > -(-n // 8)
        first = {(d, kind): b for _, c, d, kind, b, _ in wide.ledger.rows(1) if c == k}
        assert first[("up", "logits")] == 8 * n + -(-n // 8) + 4 * C * n  # round 1: nothing held, every row sent


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_a_resumed_delta_run_ends_where_an_uninterrupted_one_does(tiny_workspace, mnist):
    """The copies a delta keeps (on the clients and the server) are in the checkpoint."""
    import shutil

    _, params, part = tiny_workspace
    params = with_section(params, "train", rounds=2, checkpoint_every=1)
    codes = {"encode_up": "delta:0.05+int8", "encode_down": "delta:0.05"}
    straight = _trainer(params, part, mnist, "straight", **codes)
    straight.start()
    straight.run_round(1)
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    straight.run_round(2)
    resumed = _trainer(params, part, mnist, "resumed", **codes)
    assert resumed.start() == 2
    resumed.run_round(2)
    assert straight.ledger.state_dict() == resumed.ledger.state_dict()
    for a, b in zip(_weights(straight), _weights(resumed)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("section, match", [
    ({"encode_up": "topk:10"}, r"fedcache\.encode_up = 'topk:10': topk:10 keeps 10 of 10 values a row"),
    ({"encode_down": "int4"}, r"fedcache\.encode_down.*'int4' is not an encoding"),
    ({"encode_up": "delta:0.1", "consistency": "step"}, r"fedcache\.encode_up = 'delta:0.1'.*needs fedcache\.consistency: round"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_params(tiny_params_raw({"fedcache": section}), methods=("fedcache",))


def test_a_delta_is_refused_where_the_simulated_clock_can_drop_a_message():
    """A delta's sender keeps the receiver's copy as if every message arrived: a download lost to a device going
    offline, or an upload a deadline drops, would part the copies for good. Sync devices that stay online lose
    nothing, so there it loads."""
    section = {"encode_down": "delta:0.1+int8", "consistency": "round"}
    train = {"algorithms": ["fedcache"], "schedule": "deadline", "deadline_quantile": 0.8}
    with pytest.raises(ConfigError, match=r"fedcache\.encode_down = 'delta:0\.1\+int8'.*dropped by the simulated"):
        parse_params(tiny_params_raw({"fedcache": section, "train": train, "devices": {"enabled": True}}),
                     methods=("fedcache",))
    params = parse_params(tiny_params_raw({"fedcache": section, "train": {"algorithms": ["fedcache"]},
                                           "devices": {"enabled": True}}), methods=("fedcache",))
    assert params.fedcache.encode_down == "delta:0.1+int8"
