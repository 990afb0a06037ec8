"""The privacy audit's sample of a run (pipeline/train/capture.py): the seeded clients' uploads to the server at the
set-up, round 1 and the last round, per-sample uploads cut to `audit.rows` rows, and their final models; passive
(the run's results do not move), and a damaged file is refused naming it and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from boundary import trainer_for
from conftest import tiny, with_section
from pipeline import paths
from pipeline.errors import InputFileError
from pipeline.train import capture


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _run(params, part, mnist, method: str, run: str, **audit):
    params = with_section(tiny(params, method), "audit", **audit)
    trainer = trainer_for(params, part, mnist, method, run)
    trainer.run()
    return trainer


def test_fedcache_keeps_seeded_rows_of_its_hashes_and_logits_and_the_final_models(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _run(params, part, mnist, "fedcache", "cap", clients=2, rows=5)
    run_dir = paths.RUNS / "cap"
    assert sorted(p.name for p in (run_dir / "audit").iterdir()) == [
        "final_models.pt", "uploads-r0.pt", "uploads-r1.pt", "uploads-r2.pt"]
    audited = trainer.sim.capture.clients
    assert len(audited) == 2
    setup = capture.load_uploads(run_dir, 0)["uploads"]
    assert sorted(setup) == audited
    for k in audited:
        client = trainer.clients[k]
        [hashes] = setup[k]
        assert hashes["kind"] == "hashes"
        ids, labels = hashes["arrays"]["sample_ids"], hashes["arrays"]["labels"]
        assert len(ids) == 5 == len(labels) == len(hashes["arrays"]["codes"])
        own = dict(zip(client.ids.tolist(), client.y_train.tolist()))
        assert all(own[i] == y for i, y in zip(ids.tolist(), labels.tolist()))  # the rows stay together
        assert hashes["arrays"]["all_labels"].tolist() == client.y_train.tolist()  # and every label it sent
        # round 1: the per-step logits of every batch, 5 rows in all, each row the id it was sent with
        logits = [p for p in capture.load_uploads(run_dir, 1)["uploads"][k] if p["kind"] == "logits"]
        assert sum(len(p["arrays"]["sample_ids"]) for p in logits) == 5
        assert set(np.concatenate([p["arrays"]["sample_ids"] for p in logits]).tolist()) <= set(own)
    models = capture.load_models(run_dir)
    assert sorted(models) == audited
    for k in audited:
        for name, t in trainer.clients[k].model.state_dict().items():
            assert torch.equal(models[k][name], t)


def test_feddkc_keeps_the_same_samples_rows_of_its_features_logits_and_labels(tiny_workspace, mnist):
    """A GKT upload sends a row per feature map (16 a sample) beside a row of logits and a label per sample: the kept
    rows are whole samples, and their places among the client's training samples (no sample ids travel)."""
    from pipeline.federation.gkt import stem_features_and_logits

    _, params, part = tiny_workspace
    trainer = _run(params, part, mnist, "feddkc", "dkc", clients=2, rows=5)
    last = max(int(p.stem.removeprefix("uploads-r")) for p in (paths.RUNS / "dkc" / "audit").glob("uploads-r*.pt"))
    for k in trainer.sim.capture.clients:
        [up] = capture.load_uploads(paths.RUNS / "dkc", last)["uploads"][k]
        arrays, client = up["arrays"], trainer.clients[k]
        pos = arrays["positions"]
        assert len(pos) == len(set(pos.tolist())) == 5 and arrays["features"].shape[0] == 5 * 16
        assert arrays["labels"].tolist() == client.y_train[pos].tolist()
        feats, logits = stem_features_and_logits(client.model, client.x_train[pos], 64)  # its final model: the last
        torch.testing.assert_close(torch.as_tensor(arrays["features"]), feats.flatten(2).flatten(0, 1))  # round's
        torch.testing.assert_close(torch.as_tensor(arrays["logits"]), logits)


def test_a_model_upload_is_kept_whole(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _run(params, part, mnist, "fedavg", "avg", clients=3, rows=1)
    [k, *_] = trainer.sim.capture.clients
    kinds = {p["kind"]: p["arrays"] for p in capture.load_uploads(paths.RUNS / "avg", 2)["uploads"][k]}
    state = trainer.clients[k].model.state_dict()
    assert set(kinds["params"]) == set(state)  # every tensor, none cut to `rows`
    sent = {p["kind"]: p["arrays"] for p in capture.load_uploads(paths.RUNS / "avg", 2)["downloads"][k]}
    assert set(sent["params"]) == set(state)  # and what the server sent it, which an update is read against
    assert {n: kinds["params"][n].size for n in state} == {n: state[n].numel() for n in state}


def test_capture_is_passive_and_can_be_switched_off(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    on = _run(params, part, mnist, "fedcache", "on")
    off = _run(params, part, mnist, "fedcache", "off", capture=False)
    assert on.history == off.history and on.ledger.state_dict() == off.ledger.state_dict()
    assert not (paths.RUNS / "off" / "audit").exists()


def test_a_damaged_file_names_itself_and_the_fix(tiny_workspace, mnist):
    run_dir = paths.RUNS / "broken"
    (run_dir / "audit").mkdir(parents=True)
    capture.models_file(run_dir).write_bytes(b"not a torch file")
    with pytest.raises(InputFileError, match=r"final_models\.pt is unreadable .*audit\.capture: true"):
        capture.load_models(run_dir)
    with pytest.raises(InputFileError, match=r"uploads-r1\.pt not found; .*dvc repro -f train@"):
        capture.load_uploads(run_dir, 1)
