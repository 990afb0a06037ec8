"""Parameter averaging with encoded states (`<method>.encode_down`: the global state; `encode_up`: each client's
change to the global it decoded): counted exactly, within the encoding's error of the float32 run, and refused
when the encoding is not one a state can take."""

from __future__ import annotations

import pytest
import torch

from boundary import assert_ledger_follows_the_declared_formula, run_tallied, trainer_for
from conftest import tiny, tiny_params_raw
from pipeline.config import ConfigError, parse_params
from pipeline.encoding_spec import parse
from pipeline.federation.averaging import decode_state, encode_state
from pipeline.train.engine import Trainer


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _run(params, part, mnist, method: str, run: str, rounds: int = 2, **codes) -> tuple[Trainer, dict]:
    trainer = trainer_for(tiny(params, method), part, mnist, method, run, **codes)
    return trainer, run_tallied(trainer, rounds)


@pytest.mark.parametrize("method, codes", [("fedavg", [("int8", "int8"), ("float16", "int8"), ("float32", "float16")]),
                                           ("mtfl", [("int8", "int8")]), ("pfedme", [("float16", "int8")])])
def test_encoded_states_are_counted_exactly(tiny_workspace, mnist, method, codes):
    _, params, part = tiny_workspace
    plain, _ = _run(params, part, mnist, method, f"{method}-plain", rounds=1)
    for down, up in codes:
        trainer, crossed = _run(params, part, mnist, method, f"{method}-{down}-{up}", rounds=1, encode_down=down,
                                encode_up=up)
        assert trainer.ledger.total() == crossed["bytes"] == crossed["serialized"], (down, up)
        assert_ledger_follows_the_declared_formula(trainer)
        ratio = trainer.ledger.total(setup=False) / plain.ledger.total(setup=False)
        assert ratio < (0.6 if "float32" not in (down, up) else 0.8), (down, up, ratio)  # fewer bytes both ways


def test_the_server_rebuilds_a_client_state_within_int8s_step():
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(16, 3, 3, 3, generator=g), "b": torch.randn(16, generator=g),
            "n": torch.tensor(7, dtype=torch.int64)}
    state = {n: (t + 0.01 * torch.randn(t.shape, generator=g) if t.is_floating_point() else t + 1)
             for n, t in base.items()}
    spec = parse("int8")
    parts, decoded = encode_state(spec, state, base=base)
    rebuilt = decode_state(spec, parts, base, base=base)
    for name in state:
        assert torch.equal(rebuilt[name], decoded[name])  # what the sender expects the receiver to hold
    change = (state["w"] - base["w"]).reshape(16, -1)
    step = (change.amax(dim=1) - change.amin(dim=1)) / 255
    assert ((rebuilt["w"] - state["w"]).reshape(16, -1).abs() <= step[:, None] / 2 + 1e-6).all()
    assert torch.equal(rebuilt["n"], state["n"])  # an integer buffer travels as it is


@pytest.mark.parametrize("method", ["fedavg", "mtfl", "pfedme"])
def test_a_state_encoding_other_than_float32_float16_int8_is_refused_naming_the_key(method):
    with pytest.raises(ConfigError, match=rf"{method}\.encode_up"):
        parse_params(tiny_params_raw({method: {"encode_up": "topk:3"}}), methods=(method,))
