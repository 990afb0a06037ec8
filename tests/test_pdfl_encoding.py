"""pDFL with encoded relays (`pdfl.encode_models`: the model states a client relays, its own model and its feedback
copies; `pdfl.encode_knowledge`: its knowledge P): the ledger counts on every edge the encoded parts that crossed
(walked and serialized as .npy, equal to it; every row weighs what `wire` declares), each receiver runs and weighs
what it decoded, the float32 default relays what it always relayed, and a bad encoding is refused naming the key."""

from __future__ import annotations

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, run_tallied, trainer_for
from conftest import tiny, tiny_params_raw, unit_tier_first
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.averaging import decode_state
from pipeline.methods.pdfl import method as pdfl
from pipeline.train.engine import Trainer

C = 10


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _trainer(params, part, mnist, run: str, **codes) -> Trainer:
    return trainer_for(tiny(params, "pdfl"), part, mnist, "pdfl", run, external_peers=1, **codes)


def _run(trainer: Trainer, rounds: int = 2) -> dict:
    """Two rounds: the feedback copies of round 1 are delivered (and counted) in round 2."""
    return run_tallied(trainer, rounds)


def _delivered(trainer: Trainer) -> list[tuple[int, object]]:
    """Every (receiver, payload) the simulation delivers, as it crossed."""
    sim, seen = trainer.sim, []
    deliver = sim.deliver

    def seen_deliver(round_, client, payloads, at=None):
        seen.extend((client, p) for p in payloads)
        return deliver(round_, client, payloads, at)

    sim.deliver = seen_deliver
    return seen


# (and the two below) the other encodings repeat the check (make test); each codec's bytes: tests/test_encoding.py
@pytest.mark.parametrize("models, knowledge", unit_tier_first([("float16", "int8"), ("int8", "float16")]))
def test_encoded_relays_are_counted_exactly_on_every_edge(tiny_workspace, mnist, models, knowledge):
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "enc", encode_models=models, encode_knowledge=knowledge)
    crossed = _run(trainer)
    assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
    assert_ledger_follows_the_declared_formula(trainer)
    kinds = {kind for r in trainer.ledger.counts for (_, _, kind, _) in trainer.ledger.counts[r]}
    assert kinds == {"model", "knowledge", "feedback"}


def _int8_state_bytes(state: dict[str, torch.Tensor]) -> int:
    """int8 per tensor row (first dimension by the rest; a vector or scalar is one row): a byte a value, its minimum
    and step; integer buffers as they are."""
    total = 0
    for t in state.values():
        if not t.is_floating_point():
            total += t.numel() * t.element_size()
            continue
        rows = t.shape[0] if t.dim() > 1 else 1
        total += t.numel() + 8 * rows
    return total


@pytest.mark.slow  # a run for each encoding (the unit tier keeps the relays counted exactly): the end-to-end tier
def test_the_declared_formula_is_what_the_encodings_weigh(tiny_workspace, mnist):
    """Per edge: an int8 model weighs a byte a value and 8 bytes a tensor row; P at topk:3 weighs per class 3
    float32 values, their uint8 columns and the float32 rest, at argmax one uint8 label; the counts 8 bytes each.
    Counted exactly too, as above."""
    _, params, part = tiny_workspace
    for knowledge, row in (("topk:3", 3 * 5 + 4), ("argmax", 1)):
        trainer = _trainer(params, part, mnist, knowledge, encode_models="int8", encode_knowledge=knowledge)
        crossed = _run(trainer)
        assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"]
        assert_ledger_follows_the_declared_formula(trainer)
        model = _int8_state_bytes(trainer.clients[0].model.state_dict())
        assert model < sum(t.numel() * t.element_size() for t in trainer.clients[0].model.state_dict().values()) / 3
        for r in (1, 2):
            for _, k, direction, kind, size, peer in trainer.ledger.rows(r):
                assert direction == "up" and peer != k
                assert size == {"model": model, "feedback": model, "knowledge": C * row + 8 * C}[kind], (r, k, kind)


def test_each_receiver_uses_what_it_decoded(tiny_workspace, mnist, monkeypatch):
    """The peer copies a client optimises are the int8 models it decoded, and its attention keys are made of the
    knowledge it decoded (top-k of log P: softmax brings the dropped classes' mass back, rows sum to 1). A feedback
    copy that was not decoded could not be loaded at all: its parts are named after the int8 rows."""
    _, params, part = tiny_workspace
    trainer = _trainer(params, part, mnist, "decoded", encode_models="int8", encode_knowledge="topk:3")
    delivered = _delivered(trainer)
    keys, held, current = {}, {}, []
    representations = pdfl.representations

    def spy(soft, counts):  # a client's query first, then its neighbours' keys: the last call is the keys
        keys[current[-1]] = (soft.clone(), counts.clone())
        return representations(soft, counts)

    monkeypatch.setattr(pdfl, "representations", spy)
    begin = trainer.sim.local.begin

    def begin_and_keep(client, download, round_):
        current.append(client.id)
        targets = begin(client, download, round_)
        held[client.id] = [(j, {n: t.clone() for n, t in state.items()}) for j, state in client.state["held"]]
        return targets

    trainer.sim.local.begin = begin_and_keep
    _run(trainer, rounds=1)
    models, knowledge = parse("int8"), parse("topk:3")
    template = trainer.clients[0].model.state_dict()
    sent = {(i, p.sender, p.kind): p.arrays for i, p in delivered}
    assert any(kind == "feedback" for _, _, kind in sent) is False  # round 1: no feedback yet
    for i, copies in held.items():
        for j, state in copies:
            parts = sent[(i, j, "model")]
            assert "stem.0.weight.q" in parts and parts["stem.0.weight.q"].dtype == torch.uint8
            expect = decode_state(models, parts, template)
            assert all(torch.equal(state[n].cpu(), t) for n, t in expect.items())
    # the keys: each client's neighbours' knowledge as decoded
    assert keys.keys() == held.keys() == {c.id for c in trainer.clients}
    for i, (soft, counts) in keys.items():
        neighbours = sorted(j for (r, j, kind) in sent if r == i and kind == "knowledge")
        for row, j in enumerate(neighbours):
            decoded = pdfl.decode_knowledge(knowledge, sent[(i, j, "knowledge")], C)
            assert torch.equal(soft[row], decoded["soft"]) and torch.equal(counts[row], decoded["counts"])
            present = decoded["counts"] > 0
            torch.testing.assert_close(decoded["soft"][present].sum(dim=1), torch.ones(int(present.sum())))


def test_knowledge_decodes_to_probabilities_with_absent_classes_zero():
    gen = torch.Generator().manual_seed(0)
    soft = torch.softmax(3 * torch.randn(C, C, generator=gen), dim=1)
    counts = torch.randint(1, 9, (C,), generator=gen)
    soft[4], counts[4] = 0.0, 0  # a class the sender lacks: a zero row (-inf throughout as log P)
    for text, tolerance in (("float16", 1e-3), ("int8", 1 / 255), ("topk:3", 1.0), ("argmax", 1.0)):
        spec = parse(text)
        got = pdfl.decode_knowledge(spec, pdfl.encode_knowledge(spec, soft, counts), C)
        assert torch.equal(got["counts"], counts) and torch.isfinite(got["soft"]).all(), text
        assert (got["soft"][4] == 0).all(), text
        assert ((got["soft"] - soft).abs() <= tolerance).all(), text
        if spec.kind in pdfl.LOG_SPACE:  # probabilities again, each class's most predicted label kept
            present = counts > 0
            torch.testing.assert_close(got["soft"][present].sum(dim=1), torch.ones(int(present.sum())))
            assert torch.equal(got["soft"][present].argmax(dim=1), soft[present].argmax(dim=1)), text
    top = pdfl.decode_knowledge(parse("topk:3"), pdfl.encode_knowledge(parse("topk:3"), soft, counts), C)["soft"]
    kept = soft.topk(3, dim=1).indices
    torch.testing.assert_close(top.gather(1, kept)[counts > 0], soft.gather(1, kept)[counts > 0])  # kept exactly


def test_the_float32_default_relays_the_plain_model_and_knowledge(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    assert (params.pdfl.encode_models, params.pdfl.encode_knowledge) == ("float32", "float32")
    trainer = _trainer(params, part, mnist, "default")
    delivered = _delivered(trainer)
    _run(trainer)
    names = set(trainer.clients[0].model.state_dict())
    state_bytes = sum(t.numel() * t.element_size() for t in trainer.clients[0].model.state_dict().values())
    for _, p in delivered:
        if p.kind == "knowledge":
            assert set(p.arrays) == {"soft", "counts"} and p.arrays["soft"].dtype == torch.float32
        else:
            assert set(p.arrays) == names and p.arrays["stem.0.weight"].dtype == torch.float32
    for r in (1, 2):
        for _, _, _, kind, size, _ in trainer.ledger.rows(r):
            assert size == (4 * C * C + 8 * C if kind == "knowledge" else state_bytes)


@pytest.mark.parametrize("section, match", [
    ({"encode_models": "topk:3"}, r"pdfl\.encode_models = 'topk:3'"),
    ({"encode_models": "argmax"}, r"pdfl\.encode_models = 'argmax'"),
    ({"encode_knowledge": "delta:0.1"}, r"pdfl\.encode_knowledge = 'delta:0\.1': a client relays one knowledge"),
    ({"encode_knowledge": "topk:10"}, r"pdfl\.encode_knowledge = 'topk:10': topk:10 keeps 10 of 10 values a row"),
    ({"encode_knowledge": "int4"}, r"pdfl\.encode_knowledge.*'int4' is not an encoding"),
])
def test_a_bad_encoding_is_refused_when_params_load_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_params(tiny_params_raw({"pdfl": section}), methods=("pdfl",))
