"""Top-k model changes with error feedback (`<method>.encode_up: topk:F`, FedAvg, MTFL, pFedMe; FedAlt's in
tests/test_fedalt_encoding.py): each tensor's change keeps the fraction F of its entries, the largest in magnitude;
what a client leaves out it adds to its next change (pipeline/federation/averaging.py: encode_change). Counted
exactly, the declared sizes computed from the shapes alone, the residual carried forward and checkpointed, and a
top-k a state cannot take refused when params load, naming the key."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, tally_the_boundary, trainer_for
from conftest import tiny, tiny_params_raw, with_section
from pipeline import paths
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.averaging import decode_state, encode_change, encode_state, state_size
from pipeline.federation.contract import state_bytes
from pipeline.train.engine import Trainer


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, method: str, run: str, **codes) -> Trainer:
    return trainer_for(tiny(params, method), part, mnist, method, run, **codes)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"conv": torch.randn(16, 8, 3, 3, generator=g), "bias": torch.randn(16, generator=g),
            "fc": torch.randn(100, 400, generator=g), "steps": torch.tensor(5, dtype=torch.int64)}


def test_what_top_k_left_out_in_one_round_is_sent_in_later_ones():
    """Error feedback: a change of 4 entries at topk:0.25 (one entry a round) reaches the server whole in 4 rounds,
    the largest first, though the client changes nothing after the first round."""
    spec, client = parse("topk:0.25"), SimpleNamespace(state={})
    base = {"w": torch.zeros(4)}
    state = {"w": torch.tensor([0.5, -3.0, 1.0, 2.0])}  # the change of round 1; rounds 2 to 4 train nothing
    sent = []
    for round_ in range(4):
        start = base if round_ == 0 else state  # the client starts later rounds from where it is (no new change)
        parts = encode_change(client, spec, state, start)
        sent.append(decode_state(spec, parts, base)["w"])
    assert [s.nonzero().flatten().tolist() for s in sent] == [[1], [3], [2], [0]]  # by magnitude, one a round
    assert torch.equal(sum(sent), state["w"])  # all of it arrived
    assert torch.equal(client.state["residual"]["w"], torch.zeros(4))  # nothing left to send


def test_without_feedback_what_top_k_drops_is_lost_and_other_encodings_keep_no_residual():
    spec, client = parse("topk:0.25"), SimpleNamespace(state={})
    state, base = {"w": torch.tensor([0.5, -3.0, 1.0, 2.0])}, {"w": torch.zeros(4)}
    encode_change(client, spec, state, base, feedback=False)
    assert client.state == {}
    encode_change(client, parse("int8"), state, base)
    assert client.state == {}  # FedAvg, MTFL, pFedMe's int8: each round's change on its own, as before


@pytest.mark.parametrize("text", ["float32", "float16", "int8", "topk:0.01", "topk:0.3"])
def test_the_declared_size_is_computed_from_the_shapes_and_is_what_travels(text):
    spec, state = parse(text), _state()
    parts, _ = encode_state(spec, state)
    assert state_size(spec, state) == state_bytes(parts)
    if spec.kind == "topk":  # the formula: round(F * n) values (float32) and positions of each n-entry tensor
        columns = {"conv": (2, torch.int16), "bias": (1, torch.uint8), "fc": (4, torch.int32)}
        formula = 8 + sum(max(1, round(spec.fraction * state[n].numel())) * (4 + size)
                          for n, (size, dtype) in columns.items())
        assert state_size(spec, state) == formula
        assert {parts[f"{n}.columns"].dtype for n in columns} == {dtype for _, dtype in columns.values()}


def test_top_k_of_a_tensor_keeps_its_largest_entries_wherever_they_are():
    """One row a tensor: the entries kept are the tensor's largest, not a quota per output channel."""
    change = torch.zeros(8, 50)
    change[3, :10] = torch.arange(1.0, 11.0)  # all the large entries in one output channel
    change[5, 7] = 0.5
    spec = parse("topk:0.025")  # 10 of 400
    _, decoded = encode_state(spec, {"w": change})
    assert torch.equal(decoded["w"], change * (change >= 1))


@pytest.mark.parametrize("method, down", [("fedavg", "int8"), ("mtfl", "float32"), ("pfedme", "float16")])
def test_top_k_changes_are_counted_exactly_and_follow_the_declared_formula(tiny_workspace, mnist, method, down):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, method, f"{method}-topk", encode_down=down, encode_up="topk:0.01")
    crossed = tally_the_boundary(trainer)
    trainer.start()
    trainer.run_round(1)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    global_bytes = state_bytes(trainer.server.global_state)
    ups = [size for _, _, direction, kind, size, _ in trainer.ledger.rows(1) if (direction, kind) == ("up", "params")]
    assert ups and all(size < global_bytes / 20 for size in ups)  # 1% of the values, each with its position
    residuals = [c.state["residual"] for c in trainer.clients if "residual" in c.state]
    assert residuals and all(any(t.abs().sum() > 0 for t in r.values()) for r in residuals)  # what was left out


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_a_resumed_top_k_run_ends_where_an_uninterrupted_one_does(tiny_workspace, mnist):
    """The residuals are client state: in the checkpoint, so the resumed round adds them as the straight one does."""
    _, params, part = tiny_workspace
    params = with_section(params, "train", rounds=2, checkpoint_every=1)
    codes = {"encode_down": "int8", "encode_up": "topk:0.05"}
    straight = _trainer(params, part, mnist, "fedavg", "straight", **codes)
    straight.start()
    straight.run_round(1)
    shutil.copytree(paths.RUNS / "straight", paths.RUNS / "resumed")
    shutil.copy(paths.CHECKPOINTS / "straight.pt", paths.CHECKPOINTS / "resumed.pt")
    straight.run_round(2)
    resumed = _trainer(params, part, mnist, "fedavg", "resumed", **codes)
    assert resumed.start() == 2
    resumed.run_round(2)
    assert straight.ledger.state_dict() == resumed.ledger.state_dict()
    for a, b in zip(straight.clients, resumed.clients):
        for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()):
            assert torch.equal(x, y)
        assert a.state.keys() == b.state.keys()
        for name in a.state.get("residual", {}):
            assert torch.equal(a.state["residual"][name], b.state["residual"][name])
    for name, t in straight.server.global_state.items():
        assert torch.equal(t, resumed.server.global_state[name])


@pytest.mark.parametrize("method", ["fedavg", "mtfl", "pfedme"])
@pytest.mark.parametrize("key, value, match", [
    ("encode_up", "topk:3", r"a client's change travels up as one of float32, float16, int8, or topk:F"),
    ("encode_down", "topk:0.01", r"a model state travels down as one of float32, float16, int8 \(topk:F sparsifies"),
    ("encode_up", "delta:0.1", r"a client's change travels up as one of"),
    ("encode_up", "topk:1.5", r"topk needs how many values a row keeps"),
])
def test_a_top_k_a_state_cannot_take_is_refused_naming_the_key(method, key, value, match):
    with pytest.raises(ConfigError, match=rf"{method}\.{key}(.|\n)*{match}"):
        parse_params(tiny_params_raw({method: {key: value}}), methods=(method,))


def test_a_fraction_loads_and_is_written_canonically():
    params = parse_params(tiny_params_raw({"fedavg": {"encode_up": "topk:.010"}}), methods=("fedavg",))
    assert params.fedavg.encode_up == "topk:0.01"
