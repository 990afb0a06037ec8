"""FedAlt with encoded blocks (`fedalt.encode_down`: the blocks sent down; `fedalt.encode_up`: each uploaded block's
change from what the client started the round from, with error feedback): counted exactly, sized as declared, the
server's copy of a client's kept blocks following the client's model, resumed runs ending where straight ones do,
and bad encodings refused when params load, naming the key."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, tally_the_boundary, trainer_for
from conftest import tiny_params_raw, with_section
from models.multiexit import NUM_BLOCKS, block_state
from pipeline import paths
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.averaging import decode_state, encode_change
from pipeline.federation.contract import state_bytes
from pipeline.train.engine import Trainer


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, run: str, **codes) -> Trainer:
    # compute tiers 1 and 2 only: every client keeps at least its last block, which travels up as a change from
    # the client's own block (the server adds it to its copy)
    return trainer_for(params, part, mnist, "fedalt", run, capacity=[0.5, 0.5, 0.0], **codes)


def _assert_counted_exactly(trainer: Trainer, crossed: dict, down: str, up: str) -> None:
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    plain = {f"block{b}": state_bytes(block_state(trainer.server.global_state, b)) for b in range(1, NUM_BLOCKS + 1)}
    rows = [(direction, kind, size) for r in trainer.ledger.counts for _, _, direction, kind, size, _ in
            trainer.ledger.rows(r) if kind in plain]
    assert {kind for direction, kind, _ in rows if direction == "down"} < set(plain)  # no client got every block
    bound = {"int8": 0.4, "float16": 0.51, "topk:0.05": 0.15}  # int8: a minimum and step per row (d + 8 bytes)
    assert all(size < bound[down if direction == "down" else up] * plain[kind] for direction, kind, size in rows)
    assert set(trainer.server.copies) == {c.id for c in trainer.clients if "base" in c.state}  # kept per client


def test_encoded_blocks_are_counted_exactly_and_follow_the_declared_formula(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "fedalt-float16-int8", encode_down="float16", encode_up="int8")
    crossed = tally_the_boundary(trainer)
    trainer.start()
    trainer.run_round(1)
    _assert_counted_exactly(trainer, crossed, "float16", "int8")


@pytest.mark.parametrize("text", ["int8", "topk:0.1"])
def test_the_servers_copy_of_a_block_the_client_keeps_follows_the_client(text):
    """A block never sent down: each round the client uploads its change since the round's start plus what its
    encoding left out before; the server adds the decoded change to its copy, which stays the client's block less
    the residual the client still holds (so nothing an encoding drops is lost, and int8's errors do not pile up)."""
    spec, client = parse(text), SimpleNamespace(state={})
    g = torch.Generator().manual_seed(0)
    block = {"w": torch.randn(16, 27, generator=g), "n": torch.tensor(3, dtype=torch.int64)}
    copy = {n: t.clone() for n, t in block.items()}  # the initial model: what both start from
    for _ in range(5):
        start = {n: t.clone() for n, t in block.items()}
        block = {"w": block["w"] + 0.05 * torch.randn(16, 27, generator=g), "n": block["n"] + 1}  # a round's training
        parts = encode_change(client, spec, block, start, feedback=True)
        copy = decode_state(spec, parts, copy, base=copy)
        torch.testing.assert_close(copy["w"] + client.state["residual"]["w"], block["w"], rtol=0, atol=1e-5)
        assert torch.equal(copy["n"], block["n"])  # an integer buffer travels as it is
    assert client.state["residual"]["w"].abs().max() > 0  # lossy: the check above could fail


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_top_k_blocks_are_counted_exactly_and_a_resumed_run_ends_where_a_straight_one_does(tiny_workspace, mnist):
    """The server's copies and the clients' residuals and bases are in the checkpoint."""
    _, params, part = tiny_workspace
    params = with_section(params, "train", rounds=2, checkpoint_every=1)
    codes = {"encode_down": "int8", "encode_up": "topk:0.05"}
    straight = _trainer(params, part, mnist, "straight", **codes)
    crossed = tally_the_boundary(straight)
    straight.start()
    straight.run_round(1)
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    straight.run_round(2)
    _assert_counted_exactly(straight, crossed, "int8", "topk:0.05")  # round 2 adds changes to the server's copies
    resumed = _trainer(params, part, mnist, "resumed", **codes)
    assert resumed.start() == 2
    resumed.run_round(2)
    assert straight.ledger.state_dict() == resumed.ledger.state_dict()
    for a, b in zip(straight.clients, resumed.clients):
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()):
            assert torch.equal(x, y)
    assert straight.server.copies.keys() == resumed.server.copies.keys() and straight.server.copies
    for name, t in straight.server.global_state.items():
        assert torch.equal(t, resumed.server.global_state[name])


@pytest.mark.parametrize("section, extra, match", [
    ({"encode_down": "topk:0.01"}, {}, r"fedalt\.encode_down = 'topk:0\.01'.*travels down as one of float32"),
    ({"encode_up": "topk:2"}, {}, r"fedalt\.encode_up = 'topk:2'.*or topk:F"),
    ({"encode_up": "delta:0"}, {}, r"fedalt\.encode_up = 'delta:0'.*travels up as one of"),
    ({"encode_up": "int8"}, {"train": {"algorithms": ["fedalt"], "schedule": "deadline", "deadline_quantile": 0.8},
                             "devices": {"enabled": True}},
     r"fedalt\.encode_up = 'int8' sends each block as its change .* dropped"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(section, extra, match):
    raw = tiny_params_raw({"fedalt": section, **extra})
    with pytest.raises(ConfigError, match=match):
        parse_params(raw, methods=("fedalt",))


def test_lossy_uploads_load_where_no_upload_is_dropped():
    raw = tiny_params_raw({"fedalt": {"encode_up": "topk:0.01", "encode_down": "float16"},
                           "train": {"algorithms": ["fedalt"]}, "devices": {"enabled": True}})
    params = parse_params(raw, methods=("fedalt",))
    assert (params.fedalt.encode_down, params.fedalt.encode_up) == ("float16", "topk:0.01")
