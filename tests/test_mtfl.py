"""MTFL: FedAvg whose BatchNorm layers stay on each client; only the other tensors travel."""

import duckdb
import pytest
import torch

from pipeline import paths
from pipeline.methods.registry import REGISTRY
from conftest import with_section
from pipeline.federation.averaging import weighted_average
from pipeline.federation.contract import state_bytes
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


def test_the_round_figure_reads_the_global_shared_layers_with_the_clients_own_batchnorm(tiny_workspace, mnist):
    """mtfl.eval before_local (the default): each client's figure is the server's new shared tensors in its
    own model, whose BatchNorm (parameters and running statistics) stays its own, before local training;
    after_local, the other reading, is the client's trained model as it is."""
    from pipeline.federation.clients import evaluate_model

    _, params, part = tiny_workspace
    trainer = Trainer(params, REGISTRY["mtfl"], part, mnist, paths.run_dir("mtfl"), paths.checkpoint_path("mtfl"),
                      RunResultsDB(paths.run_results("mtfl")), [paths.PARTITION])
    trainer.start()
    trainer.run_round(1)
    rows, extras = trainer.sim.evaluate(1)
    server, bs = trainer.server, params.train.eval_batch_size
    assert not set(server.global_state) & server.private  # no BatchNorm tensor is global
    for (k, acc, n), client in zip(rows, trainer.clients):
        by_hand = build_model(params.train.model, 1, part.num_classes)
        by_hand.load_state_dict({**client.model.state_dict(), **server.global_state})  # shared: the server's
        for name, t in by_hand.state_dict().items():  # BatchNorm: the client's trained values, buffers included
            if name in server.private:
                assert torch.equal(t, client.model.state_dict()[name]), name
        assert acc == evaluate_model(by_hand, client.x_test, client.y_test, bs)[0]
    # the clients' own models (after local training) differ from the global reading: both are meant
    after = sum(evaluate_model(c.model, c.x_test, c.y_test, bs)[0] for c in trainer.clients) / len(trainer.clients)
    assert extras["acc_after_local"] == pytest.approx(after)
    assert any(not torch.equal(c.model.state_dict()[n], t) for c in trainer.clients
               for n, t in server.global_state.items())


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
    assert sorted(rows) == sorted([(r, k, d, "params", shared_bytes) for r in range(1, 4) for k in range(K)
                                   for d in ("down", "up")] + [(3, k, "down", "final_params", shared_bytes)
                                                               for k in range(K)]  # the last figure's download
                                  + [(r, k, "up", "num_samples", 4) for r in range(1, 4) for k in range(K)])
    assert summary["bytes_total"] == (3 * K * 2 + K) * shared_bytes + 3 * K * 4
    # learns: above chance (10 classes) and its untrained start. The figure is MTFL's own reading (the global
    # shared layers with the client's BatchNorm, before local training), slower to rise than the trained
    # models': seeds 0-2 gave 0.109 -> 0.317, 0.104 -> 0.336, 0.099 -> 0.252
    assert summary["maua"] > max(0.2, accs[0] + 0.1), accs
    # the server's shared tensors are the sample-weighted mean of what the clients uploaded last
    expected = weighted_average([shared_state(c.model, trainer.server.private) for c in trainer.clients],
                                [float(c.num_train) for c in trainer.clients])
    for name, t in trainer.server.global_state.items():
        assert torch.allclose(t.float(), expected[name].float(), atol=1e-6), name


@pytest.mark.parametrize("reading", ["before_local", "after_local"])
def test_the_download_the_last_evaluation_reads_is_counted_in_the_last_round(tiny_workspace, mnist, reading):
    """Issue 36: with mtfl.eval before_local every client's figure reads the server's new shared layers, which a
    round's download brings to the clients selected next; after the last round there is no next round, so those
    layers are sent to every client then, and counted as the last round's download traffic (kind final_params;
    timed with the clock on: the run ends when the last client has them). after_local reads the clients' own
    models: nothing more travels."""
    _, params, part = tiny_workspace
    params = with_section(with_section(params, "mtfl", eval=reading), "devices", enabled=True)
    trainer = Trainer(params, REGISTRY["mtfl"], part, mnist, paths.run_dir("mtfl"), paths.checkpoint_path("mtfl"),
                      RunResultsDB(paths.run_results("mtfl")), [paths.PARTITION])
    summary = trainer.run()
    last, K = params.train.rounds, len(trainer.clients)
    shared_bytes = state_bytes(trainer.server.global_state)
    final = {(k, b) for _, k, d, kind, b, _ in trainer.ledger.rows(last) if kind == "final_params"}
    before = reading == "before_local"
    assert final == ({(k, shared_bytes) for k in range(K)} if before else set())
    assert all(kind != "final_params" for r in range(last) for *_, kind, _, _ in trainer.ledger.rows(r))
    assert summary["bytes_down"] == (last + before) * K * shared_bytes
    with duckdb.connect(str(paths.run_results("mtfl")), read_only=True) as con:
        [(bytes_down, end)] = con.execute("SELECT bytes_down, sim_time_s FROM rounds WHERE run_id = ? AND round = ?",
                                          [summary["run_id"], last]).fetchall()
        stamps = con.execute("SELECT sim_time_s FROM comm WHERE run_id = ? AND round = ? AND kind = 'final_params'",
                             [summary["run_id"], last]).fetchall()
    assert bytes_down == (1 + before) * K * shared_bytes  # the round's start download, and the final one
    plan = trainer.sim.last_plan
    if before:  # each client's copy arrives over its own downlink from the round's end; the run ends at the last
        clock = trainer.sim.clock
        expected = sorted(plan.end + shared_bytes / clock.devices[k].down_bytes_per_s for k in range(K))
        assert sorted(t for (t,) in stamps) == pytest.approx(expected)
        assert end == pytest.approx(expected[-1]) == pytest.approx(summary["sim_time_s"])
    else:
        assert not stamps and end == pytest.approx(plan.end)
