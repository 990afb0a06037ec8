"""pFedMe: theta solved with K steps per batch on the Moreau-envelope term, w moving toward theta after each batch, w averaged."""

import duckdb
import pytest
import torch

from conftest import tiny, with_section
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.federation.averaging import state_copy
from pipeline.methods.pfedme.method import PFedMeClient
from pipeline.federation.ledger import Payload
from pipeline.train.engine import SequentialExecutor, Trainer
from pipeline.results.store import RunResultsDB


def _trainer(params, part, mnist):
    return Trainer(params, REGISTRY["pfedme"], part, mnist, paths.run_dir("pfedme"), paths.checkpoint_path("pfedme"),
                   RunResultsDB(paths.run_results("pfedme")), [paths.PARTITION])


def test_a_round_replayed_by_hand(tiny_workspace, mnist, float64):
    """Replaying one client's round by hand: on every batch, K plain gradient steps on theta at the personal
    learning rate on CE + lambda/2 ||theta - w||^2 + mu/2 ||theta||^2, then once w <- w - eta * lambda * (w - theta);
    the upload is w (with theta's buffers). train.lr and the train section's momentum play no part."""
    _, params, part = tiny_workspace
    params = with_section(params, "pfedme", K=3, personal_lr=0.05, mu=0.01)
    params = with_section(params, "train", lr=7.0, momentum=0.9)  # would blow up if theta's solver used them
    trainer = _trainer(params, part, mnist)
    client = trainer.clients[0]
    glob = state_copy(client.model)
    local = PFedMeClient(params, part.num_classes)
    local.prepare(client)
    upload = SequentialExecutor.run_client(local, client, [Payload("params", glob)], 1)

    # by hand, from the same start and the same batches
    from pipeline.federation.clients import batch_order
    from pipeline.federation.losses import ce_rows

    theta = trainer.clients[1].model  # a scratch model of the same architecture
    theta.load_state_dict(glob)
    w = {n: p.detach().clone() for n, p in theta.named_parameters()}
    p = params.pfedme
    theta.train()
    batches = batch_order(client, 1, params, 0)
    for idx in batches:
        for _ in range(p.K):
            prox = sum(((q - w[n]) ** 2).sum() for n, q in theta.named_parameters())
            loss = (ce_rows(theta(client.x_train[idx]), client.y_train[idx]) + p.lambda_ / 2 * prox).sum() / len(idx)
            grads = torch.autograd.grad(loss, list(theta.parameters()))
            with torch.no_grad():
                for q, g in zip(theta.parameters(), grads):
                    q.sub_(p.personal_lr * (g + p.mu * q))
        with torch.no_grad():
            for n, q in theta.named_parameters():
                w[n] -= p.eta * p.lambda_ * (w[n] - q)
    sent = upload.payloads[0].arrays
    assert len(batches) > 1
    for n, q in theta.named_parameters():
        assert q.dtype == torch.float64  # the replay and the method agree to float64's precision, on any CPU
        assert torch.allclose(client.model.state_dict()[n], q, rtol=1e-7, atol=1e-9), n  # theta
        assert torch.allclose(sent[n], w[n], rtol=1e-7, atol=1e-9), n  # the upload is w, not theta
    for n, buf in theta.named_buffers():  # theta's BatchNorm statistics: K forward passes per batch
        assert torch.allclose(sent[n], buf.detach(), rtol=1e-7, atol=1e-9), n
    assert any(not torch.allclose(sent[n], q) for n, q in theta.named_parameters())  # w lags behind theta


@pytest.mark.slow  # two rounds of a whole run (the conformance suite checks that pFedMe learns)
def test_pfedme_counts_full_models_down_and_up(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(tiny(params, "pfedme"), part, mnist)
    summary = trainer.run()
    model_bytes = sum(t.nbytes for t in trainer.clients[0].model.state_dict().values())
    with duckdb.connect(str(paths.run_results("pfedme")), read_only=True) as con:
        rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ?",
                           [summary["run_id"]]).fetchall()
    K = len(trainer.clients)
    rounds = range(1, params.train.rounds + 1)
    assert sorted(rows) == sorted([(r, k, d, "params", model_bytes) for r in rounds for k in range(K) for d in ("down", "up")]
                                  + [(r, k, "up", "num_samples", 4) for r in rounds for k in range(K)])  # its weight
    assert trainer.executor.name == "sequential"


@pytest.mark.parametrize("key, value", [("eta", 0), ("lambda", -1), ("beta", 3), ("K", 0), ("personal_lr", 0), ("mu", -1)])
def test_bad_pfedme_params_are_refused(default_params_raw, key, value):
    from pipeline.config import ConfigError, parse_params

    default_params_raw["pfedme"][key] = value
    with pytest.raises(ConfigError, match=f"pfedme.{key}"):
        parse_params(default_params_raw)
