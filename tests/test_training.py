"""The round loop on a tiny real run: ledger bytes = payload sizes, MAUA and per-client bookkeeping,
knowledge persisted to the SQL store, local-only sends nothing; rows in the run's own results file."""

import json
import os
import shlex
import sys

import duckdb
import numpy as np
import pytest
import torch

from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.index import store
from pipeline.train.engine import Trainer
from pipeline.results.store import ResultsDB, RunResultsDB


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py), a quarter of the convolution:
    these runs check the engine's bookkeeping and evaluation against hand computations, not learning."""
    return small_mnist


def _run(params, part, algorithm, mnist):
    trainer = Trainer(params, REGISTRY[algorithm], part, mnist, paths.run_dir(algorithm),
                      paths.checkpoint_path(algorithm), RunResultsDB(paths.run_results(algorithm)), [paths.PARTITION])
    return trainer, trainer.run()


def test_fedcache_bytes_equal_the_payload_formula(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer, summary = _run(params, part, "fedcache", mnist)
    C = part.num_classes
    h = np.load(paths.HASHES)
    code = h.shape[1] * h.itemsize  # bytes of one sample's code (packed bits or float16)
    sizes = np.diff(part.train_offsets)
    con = duckdb.connect(str(paths.run_results("fedcache")), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ? ORDER BY ALL",
                       [summary["run_id"]]).fetchall()
    per_round = con.execute("SELECT round, bytes_up, bytes_down FROM rounds WHERE run_id = ? ORDER BY round",
                            [summary["run_id"]]).fetchall()
    con.close()
    expected = []
    for k, n in enumerate(sizes):
        expected.append((0, k, "up", "hashes", int(n * (8 + 8 + code))))  # ids, labels, codes
    for r in (1, 2):
        for k, n in enumerate(sizes):
            expected += [(r, k, "down", "knowledge", int(n * 4 * C)), (r, k, "up", "logits", int(n * (8 + 4 * C)))]
    assert sorted(rows) == sorted(expected)
    N = int(sizes.sum())
    assert per_round == [(0, N * (16 + code), 0), (1, N * (8 + 4 * C), N * 4 * C), (2, N * (8 + 4 * C), N * 4 * C)]
    assert summary["bytes_setup"] == N * (16 + code)
    assert summary["bytes_total"] == N * (16 + code) + 2 * N * (8 + 8 * C)


def test_maua_and_per_client_bookkeeping(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    _, summary = _run(params, part, "local", mnist)
    con = duckdb.connect(str(paths.run_results("local")), read_only=True)
    clients = con.execute("SELECT round, client_id, acc, n_test FROM client_rounds WHERE run_id = ? ORDER BY round, client_id",
                          [summary["run_id"]]).fetchall()
    rounds = con.execute("SELECT round, mean_acc FROM rounds WHERE run_id = ? ORDER BY round", [summary["run_id"]]).fetchall()
    status = con.execute("SELECT status, finished_at IS NOT NULL FROM runs WHERE run_id = ?", [summary["run_id"]]).fetchone()
    [environment] = con.execute("SELECT environment FROM runs WHERE run_id = ?", [summary["run_id"]]).fetchone()
    con.close()
    # the run's record: the exact command, the packages' versions, the CPU, the threads and device it computed with
    environment = json.loads(environment)
    assert environment["command"] == shlex.join(sys.orig_argv)
    assert torch.__version__.startswith(environment["packages"]["torch"])  # 2.14.1 (+cu... in torch.__version__)
    assert environment["cpu"].endswith(f"{os.cpu_count()} CPUs") and environment["device"] == "cpu"
    assert environment["torch_threads"] == torch.get_num_threads()
    n_test = np.diff(part.test_offsets).tolist()
    for r, mean in rounds:
        mine = [c for c in clients if c[0] == r]
        assert [c[1] for c in mine] == [0, 1, 2]  # every client evaluated, not only the sampled ones
        assert [c[3] for c in mine] == n_test  # on its whole test split
        assert mean == pytest.approx(np.mean([c[2] for c in mine]))  # unweighted mean over clients
        for _, _, acc, n in mine:
            assert abs(acc * n - round(acc * n)) < 1e-9  # a count of correct predictions
    assert summary["maua"] == pytest.approx(max(m for _, m in rounds))
    assert summary["final_acc"] == pytest.approx(rounds[-1][1])
    assert summary["bytes_total"] == 0
    assert status == ("finished", True)


def test_knowledge_is_persisted_each_round(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer, _ = _run(params, part, "fedcache", mnist)
    logits, rounds = store.read_knowledge(paths.run_dir("fedcache") / "cache.db")
    assert (rounds == 2).all()  # every sample uploaded in the last round
    np.testing.assert_allclose(logits, trainer.server.cache.logits.numpy())
    # the index stage's DB is left untouched
    _, source_rounds = store.read_knowledge(params.cache_db_path)
    assert (source_rounds == -1).all()


def test_partial_participation_still_evaluates_everyone(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = params.model_copy(update={"train": params.train.model_copy(update={"participation": 0.34})})
    trainer, summary = _run(params, part, "fedcache", mnist)
    # round(0.34 * 3) = 1 client per round, drawn from the round's own seed stream
    picks = [trainer.schedule.select(r) for r in range(1, 31)]
    assert all(len(s) == 1 for s in picks)
    assert picks == [trainer.schedule.select(r) for r in range(1, 31)]  # seeded: the same draw when asked again
    assert {s[0] for s in picks} == {0, 1, 2}  # the draw changes with the round: every client is picked in 30
    con = duckdb.connect(str(paths.run_results("fedcache")), read_only=True)
    trained = con.execute("SELECT DISTINCT round, client_id FROM comm WHERE run_id = ? AND round > 0 ORDER BY ALL",
                          [summary["run_id"]]).fetchall()
    evaluated = con.execute("SELECT round, count(*) FROM client_rounds WHERE run_id = ? AND round > 0 GROUP BY round "
                            "ORDER BY round", [summary["run_id"]]).fetchall()
    con.close()
    assert trained == [(1, picks[0][0]), (2, picks[1][0])]  # exactly the selected client trained and exchanged
    assert evaluated == [(1, 3), (2, 3)]  # yet every client is evaluated every round


def test_results_file_from_before_peer_id_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE comm (run_id VARCHAR, round INTEGER, client_id INTEGER, direction VARCHAR, "
                "kind VARCHAR, bytes BIGINT)")
    con.execute("INSERT INTO comm VALUES ('old', 1, 0, 'up', 'logits', 10)")
    con.close()
    db = ResultsDB(path)
    db.start_run("new", "local", "mnist", "homo", {}, "rev")
    db.write_round("new", 1, 0.5, 7, 0, 0.1, [(0, 0.5, 2)], [(1, 0, "up", "logits", 7, -1)])
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute("SELECT run_id, bytes, peer_id FROM comm ORDER BY run_id").fetchall()
    con.close()
    assert rows == [("new", 7, -1), ("old", 10, None)]  # nothing lost, new rows complete


def test_ledger_totals_by_round_direction_and_setup():
    from pipeline.federation.ledger import Ledger, Payload

    ledger = Ledger()
    ledger.record(0, 1, "up", Payload("hashes", {"codes": np.zeros(10, np.float16)}))  # 20 B set-up
    ledger.record(1, 1, "up", Payload("logits", {"l": np.zeros(3, np.float32)}))  # 12 B
    ledger.record(1, 2, "down", Payload("knowledge", {"t": np.zeros(2, np.float32)}))  # 8 B
    ledger.record(1, 1, "up", Payload("logits", {"l": np.zeros(1, np.float32)}))  # +4 B, same row
    assert ledger.rows(1) == [(1, 1, "up", "logits", 16, -1), (1, 2, "down", "knowledge", 8, -1)]
    assert (ledger.total(), ledger.total(setup=False), ledger.total(1, "up"), ledger.total(direction="up")) == (44, 24, 16, 36)
    again = Ledger()
    again.load_state_dict(ledger.state_dict())
    assert again.rows(1) == ledger.rows(1) and again.total(setup=False) == 24


def test_fresh_optimizer_starts_every_round_without_momentum(tiny_workspace, mnist):
    """train.fresh_optimizer: round 2 trains exactly as if each client's SGD were rebuilt by hand before it
    (no momentum from round 1), and differently from the default, where momentum carries over."""
    import torch

    _, params, part = tiny_workspace

    def after_two_rounds(fresh: bool, rebuild_by_hand: bool) -> list[torch.Tensor]:
        p = params.model_copy(update={"train": params.train.model_copy(update={"fresh_optimizer": fresh})})
        name = f"local-{fresh}-{rebuild_by_hand}"  # own checkpoint: no run resumes another
        trainer = Trainer(p, REGISTRY["local"], part, mnist, paths.run_dir(name), paths.checkpoint_path(name),
                          RunResultsDB(paths.run_results(name)), [paths.PARTITION])
        trainer.start()
        trainer.run_round(1)
        assert any(s for s in trainer.clients[0].optimizer.state.values())  # round 1 left momentum behind
        if rebuild_by_hand:
            for c in trainer.clients:
                c.new_optimizer()
        trainer.run_round(2)
        return [t.detach().clone() for c in trainer.clients for t in c.model.state_dict().values()]

    fresh = after_two_rounds(fresh=True, rebuild_by_hand=False)
    by_hand = after_two_rounds(fresh=False, rebuild_by_hand=True)
    carried = after_two_rounds(fresh=False, rebuild_by_hand=False)
    assert all(torch.equal(a, b) for a, b in zip(fresh, by_hand))
    assert not all(torch.equal(a, b) for a, b in zip(fresh, carried))


def test_a_client_without_test_samples_is_left_out_of_the_round_mean(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = Trainer(params, REGISTRY["local"], part, mnist, paths.run_dir("local"), paths.checkpoint_path("local"),
                      RunResultsDB(paths.run_results("local")), [paths.PARTITION])
    empty = trainer.clients[0]
    empty.x_test, empty.y_test = empty.x_test[:0], empty.y_test[:0]  # as a 0.33 % data share can leave a client
    summary = trainer.run()
    assert summary["maua"] == summary["maua"]  # not NaN
    with duckdb.connect(str(paths.run_results("local")), read_only=True) as con:
        (acc,) = con.execute("SELECT mean_acc FROM rounds WHERE run_id = ? ORDER BY round DESC LIMIT 1",
                             [summary["run_id"]]).fetchone()
        others = con.execute("SELECT avg(acc) FROM client_rounds WHERE run_id = ? AND client_id > 0 AND round = "
                             "(SELECT max(round) FROM rounds WHERE run_id = ?)", [summary["run_id"]] * 2).fetchone()[0]
    assert acc == pytest.approx(others)


def test_the_validation_split_is_evaluated_on_its_own_samples(tiny_workspace, mnist):
    """Fails if the validation reading is the test split again (clients.on_split doing nothing), or if a client's
    validation accuracy is not its final model's accuracy on its own validation samples (computed here by hand)."""
    from pipeline.federation.clients import evaluate_model, to_tensor

    _, params, part = tiny_workspace
    trainer, summary = _run(params, part, "local", mnist)
    con = duckdb.connect(str(paths.run_results("local")), read_only=True)
    last = con.execute("SELECT client_id, acc, n_test, val_acc, n_val FROM client_rounds WHERE run_id = ? AND round = ? "
                       "ORDER BY client_id", [summary["run_id"], params.train.rounds]).fetchall()
    val_mean = con.execute("SELECT value FROM round_metrics WHERE run_id = ? AND round = ? AND name = 'val_acc'",
                           [summary["run_id"], params.train.rounds]).fetchone()[0]
    con.close()
    for (k, acc, n_test, val_acc, n_val), client in zip(last, trainer.clients):
        x = to_tensor(mnist.train_x[part.client_val(k)])
        y = torch.from_numpy(part.val_labels[part.val_offsets[k]:part.val_offsets[k + 1]])
        assert (val_acc, n_val) == (pytest.approx(evaluate_model(client.model, x, y, 64)[0], abs=1e-12), len(y))
        assert n_val == np.diff(part.val_offsets)[k] != n_test
    assert val_mean == pytest.approx(np.mean([row[3] for row in last]))
    assert summary["val_final_acc"] == pytest.approx(val_mean)


def test_evaluating_another_state_reads_it_in_the_clients_model_and_leaves_the_model_as_it_was(mnist):
    """evaluate_with (FedAvg's and FedAlt's global reading, MTFL's shared layers): the accuracy of a copy of the
    model with the state loaded, the client's tensors and training mode unchanged after; a state that does not fit
    is refused naming the keys, as load_state_dict would refuse it."""
    import copy

    from models.resnet import build_model
    from pipeline.federation.clients import Client, evaluate_model, evaluate_with, to_tensor

    torch.manual_seed(0)
    model, other = build_model("resnet8", 1, 10), build_model("resnet8", 1, 10)
    x, y = to_tensor(mnist.test_x[:40]), torch.from_numpy(mnist.test_y[:40]).long()
    client = Client(0, model, torch.optim.SGD(model.parameters(), lr=0.1), x[:1], y[:1], torch.arange(1), x, y,
                    x[:0], y[:0])
    with torch.no_grad():
        for m in other.modules():  # running statistics of its own, so that eval mode reads them
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for state, strict in ((other.state_dict(), True),
                          ({k: v for k, v in other.state_dict().items() if "bn" not in k}, False)):
        by_hand = copy.deepcopy(model)
        by_hand.load_state_dict(state, strict=strict)
        assert evaluate_with(client, state, 16, strict) == evaluate_model(by_hand, x, y, 16)[0]
        assert model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    counts = torch.bincount(y, minlength=10)
    assert counts.max() > counts.min()
    for c in (int(counts.argmax()), int(counts.argmin())):  # a head that always says class c: accuracy = c's share
        head = {"head.weight": torch.zeros_like(model.head.weight), "head.bias": torch.eye(10)[c]}
        assert evaluate_with(client, head, 16, strict=False) == pytest.approx(float(counts[c]) / len(y))
    with pytest.raises(RuntimeError, match=r"unexpected \['extra'\]"):
        evaluate_with(client, {**other.state_dict(), "extra": torch.zeros(1)}, 16)
    with pytest.raises(RuntimeError, match=r"missing \['head.bias'\]"):
        evaluate_with(client, {k: v for k, v in other.state_dict().items() if k != "head.bias"}, 16)
