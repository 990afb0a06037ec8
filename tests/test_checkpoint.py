"""Checkpoints hold plain data only and are loaded with torch.load(weights_only=True): a file that
carries any other object is refused (never unpickled into code) with a message naming it."""

from __future__ import annotations

import os
from collections import OrderedDict, defaultdict

import numpy as np
import pytest
import torch

from pipeline import paths
from pipeline.train import checkpoint


class _Planted:
    """Unpickling this runs os.mkdir(<marker>): what a planted checkpoint could do with weights_only=False."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _state(**extra) -> dict:
    return {"fingerprint": "f", "run_id": "r", "round": 3, **extra}


def test_round_trip_of_what_the_engine_stores(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    counts = defaultdict(int, {(0, "up", "logits", -1): 12})
    state = _state(
        model=model.state_dict(),
        rng=torch.get_rng_state(),
        ledger={"counts": {1: counts}, "grand": defaultdict(int, {("up", False): 12})},
        topology={"base": np.eye(3, dtype=bool), "history": {2: np.array([[0, 1]], dtype=np.int64)},
                  "draws": {2: np.int64(4)}, "base_draws": 1},
        history=[(0, 0.5), (1, None)],
    )
    path = tmp_path / "ck.pt"
    checkpoint.save(path, state)
    torch.load(path, weights_only=True)  # loadable without unpickling any code
    back = checkpoint.load(path)
    assert back["round"] == 3 and back["history"] == [(0, 0.5), (1, None)]
    assert back["ledger"]["counts"][1] == {(0, "up", "logits", -1): 12}
    assert back["ledger"]["grand"] == {("up", False): 12}
    topo = back["topology"]
    assert isinstance(topo["base"], np.ndarray) and topo["base"].dtype == bool and topo["base"].tolist() == np.eye(3).astype(bool).tolist()
    assert isinstance(topo["history"][2], np.ndarray) and topo["history"][2].tolist() == [[0, 1]]
    assert topo["draws"] == {2: 4} and type(topo["draws"][2]) is int
    assert torch.equal(back["rng"], state["rng"])
    assert isinstance(back["model"], OrderedDict)
    model.load_state_dict(back["model"])  # strict: every key back, BatchNorm buffers included


def test_save_refuses_what_it_cannot_store_and_keeps_the_old_checkpoint(tmp_path):
    path = tmp_path / "ck.pt"
    checkpoint.save(path, _state())
    with pytest.raises(TypeError, match=r"state\['algorithm'\]\['x'\].*_Planted"):
        checkpoint.save(path, _state(algorithm={"x": _Planted(str(tmp_path / "never"))}))
    assert checkpoint.load(path)["round"] == 3  # untouched


def test_a_checkpoint_carrying_an_object_is_refused_and_never_run(tmp_path, capsys):
    marker = tmp_path / "planted-code-ran"
    path = tmp_path / "fedcache.pt"
    torch.save(_state(evil=_Planted(str(marker))), path)  # what a foreign torch.save could put there
    assert checkpoint.load(path) is None
    assert not marker.exists()  # the object was never unpickled
    err = capsys.readouterr().err
    assert f"refused checkpoint {path}" in err
    assert "weights_only" in err and "round 0" in err


def test_a_damaged_checkpoint_is_ignored_with_a_message(tmp_path, capsys):
    path = tmp_path / "fedcache.pt"
    checkpoint.save(path, _state())
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert checkpoint.load(path) is None
    assert f"unreadable checkpoint {path}" in capsys.readouterr().err


def test_a_training_stage_starts_afresh_over_a_planted_checkpoint(tiny_workspace, mnist, capsys):
    from pipeline.methods.registry import REGISTRY
    from pipeline.train.engine import Trainer
    from pipeline.results.store import RunResultsDB

    _, params, part = tiny_workspace
    marker = tiny_workspace[0] / "planted-code-ran"
    ckpt = paths.checkpoint_path("local")
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.save(_state(evil=_Planted(str(marker))), ckpt)
    trainer = Trainer(params, REGISTRY["local"], part, mnist, paths.run_dir("local"), ckpt,
                      RunResultsDB(paths.run_results("local")), [paths.PARTITION])
    assert trainer.start() == 1  # a new run: round 0 done, round 1 next
    assert not marker.exists()
    assert f"refused checkpoint {ckpt}" in capsys.readouterr().err
    assert checkpoint.load(ckpt)["round"] == 0  # replaced by the new run's own checkpoint
