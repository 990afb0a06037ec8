"""MTFL: FedAvg whose BatchNorm layers stay on each client; only the other tensors travel."""

import duckdb
import pytest
import torch

from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.federation.averaging import weighted_average
from pipeline.methods.mtfl.method import MTFLClient, private_names, shared_state
from pipeline.federation.ledger import Payload
from pipeline.train.engine import Trainer
from pipeline.results.store import RunResultsDB
from models.resnet import build_model


def test_private_tensors_are_exactly_the_batchnorm_ones():
    model = build_model("resnet8", 1, 10)
    private = private_names(model)
    bn = {n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    assert bn and private == {f"{layer}.{t}" for layer in bn
                              for t in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
    shared = shared_state(model, private)
    assert set(shared) | private == set(model.state_dict()) and not set(shared) & private
    assert any(n.endswith("conv1.weight") or "conv" in n for n in shared)


def test_a_download_replaces_the_shared_tensors_and_keeps_the_clients_batchnorm(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = Trainer(params, REGISTRY["mtfl"], part, mnist, paths.run_dir("mtfl"), paths.checkpoint_path("mtfl"),
                      RunResultsDB(paths.run_results("mtfl")), [paths.PARTITION])
    client = trainer.clients[1]
    private = private_names(client.model)
    with torch.no_grad():
        for name, t in client.model.state_dict().items():
            if t.is_floating_point():
                t.add_(1.0)  # the client's own values, different from anyone else's
    before = {n: t.clone() for n, t in client.model.state_dict().items()}
    glob = {n: torch.zeros_like(t) for n, t in shared_state(client.model, private).items()}
    MTFLClient(params, part.num_classes).begin(client, [Payload("params", glob)], 1)
    after = client.model.state_dict()
    for name in after:
        expected = before[name] if name in private else glob[name]
        assert torch.equal(after[name], expected), name


@pytest.mark.slow  # learning: rounds of real training (the fast tier leaves it out)
def test_mtfl_learns_and_sends_only_shared_tensors(learning_workspace, mnist):
    _, params, part = learning_workspace
    trainer = Trainer(params, REGISTRY["mtfl"], part, mnist, paths.run_dir("mtfl"), paths.checkpoint_path("mtfl"),
                      RunResultsDB(paths.run_results("mtfl")), [paths.PARTITION])
    summary = trainer.run()
    model = trainer.clients[0].model
    shared_bytes = sum(t.nbytes for t in shared_state(model, private_names(model)).values())
    with duckdb.connect(str(paths.run_results("mtfl")), read_only=True) as con:
        rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ?",
                           [summary["run_id"]]).fetchall()
        accs = [a for (a,) in con.execute("SELECT mean_acc FROM rounds WHERE run_id = ? ORDER BY round",
                                          [summary["run_id"]]).fetchall()]
    K = len(trainer.clients)
    assert sorted(rows) == sorted((r, k, d, "params", shared_bytes) for r in range(1, 4) for k in range(K)
                                  for d in ("down", "up"))
    assert summary["bytes_total"] == 3 * K * 2 * shared_bytes
    # learns: well above chance (10 classes) and its untrained start (measured: 0.045 -> 0.483)
    assert summary["maua"] > max(0.3, accs[0] + 0.2), accs
    # the server's shared tensors are the sample-weighted mean of what the clients uploaded last
    expected = weighted_average([shared_state(c.model, trainer.algorithm.private) for c in trainer.clients],
                                [float(c.num_train) for c in trainer.clients])
    for name, t in trainer.algorithm.global_state.items():
        assert torch.allclose(t.float(), expected[name].float(), atol=1e-6), name
