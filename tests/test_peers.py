"""FD and FedAvg: aggregation rules on constructed cases, and their bytes in a short real run."""

import re

import duckdb
import numpy as np
import pytest
import torch

from pipeline import paths
from pipeline.methods import registry
from pipeline.methods.registry import REGISTRY
from pipeline.methods.fd.method import leave_one_out
from pipeline.federation.losses import soft_ce_rows
from pipeline.federation.averaging import weighted_average
from pipeline.config import ConfigError
from pipeline.train.engine import Trainer
from pipeline.results.store import ResultsDB


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests check what is computed and sent, not accuracy."""
    return small_mnist



def test_fd_leave_one_out_with_a_class_held_by_one_client():
    C = 3
    sums = torch.zeros(3, C, C)
    held = torch.zeros(3, C, dtype=torch.bool)
    # class 0: clients 0, 1, 2; class 1: clients 0 and 1; class 2: client 2 only
    for k, c, v in [(0, 0, 1.0), (1, 0, 2.0), (2, 0, 6.0), (0, 1, 10.0), (1, 1, 20.0), (2, 2, 5.0)]:
        sums[k, c] = v
        held[k, c] = True
    t = leave_one_out(sums, held)
    assert torch.allclose(t[0, 0], torch.full((C,), 4.0))  # (2 + 6) / 2
    assert torch.allclose(t[2, 0], torch.full((C,), 1.5))  # (1 + 2) / 2
    assert torch.allclose(t[0, 1], torch.full((C,), 20.0)) and torch.allclose(t[1, 1], torch.full((C,), 10.0))
    assert torch.isnan(t[2, 2]).all()  # held by client 2 only: no teacher
    assert torch.allclose(t[0, 2], torch.full((C,), 5.0))  # not held by 0, but defined from the others


def test_fd_soft_cross_entropy_hand_computation():
    student = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0], [float("nan"), float("nan")]])
    # row 0: -(0.5 log s0 + 0.5 log s1) with s = softmax([2, 0])
    s = torch.softmax(student[0], 0)
    expected = -(0.5 * s.log()).sum() / 2
    assert (soft_ce_rows(student, teacher).sum() / len(student)).item() == pytest.approx(expected.item())


def test_fedavg_weighted_average():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(4)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(8)}
    avg = weighted_average([a, b], [1, 3])
    assert torch.allclose(avg["w"], torch.tensor([2.5, 5.0]))
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 7


def accuracy_by_hand(model, x, y, batch_size: int) -> float:
    """A client's accuracy on (x, y) written out: eval mode, the argmax of its own model's logits, in the
    evaluation's batches (the vectorized executor's grouped network gives the same logits to the last bits, so
    only an exact tie could flip a prediction)."""
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + batch_size]).argmax(dim=1) for i in range(0, len(y), batch_size)])
    return (pred == y).double().mean().item()


def mean_accuracy_by_hand(clients, batch_size: int) -> float:
    """A round's figure written out: the mean over clients with a test sample of each one's own model on its own
    test split (not weighted by the splits' sizes)."""
    return float(np.mean([accuracy_by_hand(c.model, c.x_test, c.y_test, batch_size) for c in clients
                          if len(c.y_test)]))


def _run(params, part, algorithm, mnist, hetero=False):
    trainer = Trainer(params, REGISTRY[algorithm], part, mnist, paths.run_dir(algorithm, hetero),
                      paths.checkpoint_path(algorithm, hetero), ResultsDB(paths.RESULTS_DB), [paths.PARTITION], hetero)
    return trainer, trainer.run()


def _comm(run_id):
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    try:
        return con.execute("SELECT round, client_id, direction, kind, bytes, peer_id FROM comm WHERE run_id = ? "
                           "ORDER BY ALL", [run_id]).fetchall()
    finally:
        con.close()


def test_fedavg_bytes_are_the_state_dict_sizes(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer, summary = _run(params, part, "fedavg", mnist)
    state_bytes = sum(t.numel() * t.element_size() for t in trainer.clients[0].model.state_dict().values())
    rows = _comm(summary["run_id"])
    assert rows == sorted([(r, k, d, "params", state_bytes, -1) for r in (1, 2) for k in range(3) for d in ("down", "up")]
                          + [(r, k, "up", "num_samples", 4, -1) for r in (1, 2) for k in range(3)])  # its weight
    # the personalized reading is the round figure; the global model's is kept as a round metric
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    names = con.execute("SELECT DISTINCT name FROM round_metrics WHERE run_id = ?", [summary["run_id"]]).fetchall()
    con.close()
    assert sorted(names) == [("acc_global",), ("val_acc",)]


def test_fedavg_refuses_heterogeneous_models(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    with pytest.raises(ConfigError, match="fedavg"):
        _run(params, part, "fedavg", mnist, hetero=True)


def test_fd_bytes_are_class_payloads(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    _, summary = _run(params, part, "fd", mnist)
    C = part.num_classes
    held = [set(part.train_labels[part.train_offsets[k]:part.train_offsets[k + 1]].tolist()) for k in range(3)]
    expected = []
    for k in range(3):
        expected += [(r, k, "up", "class_logits", len(held[k]) * (8 + 4 * C), -1) for r in (1, 2)]
        # round 2: a teacher for each held class that another client also holds
        shared = {c for c in held[k] if any(c in held[j] for j in range(3) if j != k)}
        if shared:
            expected.append((2, k, "down", "class_logits", len(shared) * (8 + 4 * C), -1))
    assert _comm(summary["run_id"]) == sorted(expected)


# FedCache's heterogeneous run in the unit tier; the others' in the end-to-end tier, as in the conformance suite
@pytest.mark.parametrize("algorithm", [pytest.param("fd", marks=pytest.mark.slow), "fedcache",
                                       pytest.param("local", marks=pytest.mark.slow)])
def test_heterogeneous_models_train(tiny_workspace, mnist, algorithm):
    """A1, A2, A3 by client id mod 3; the run's figures are those models' accuracies, written out here: round 0
    the initial models', the final round the trained models', MAUA the best round. Fails if a client gets
    another depth, if a client is evaluated with another model, on another split or with BatchNorm in train mode
    (batch statistics), or if the round's figure is not the plain mean over clients (e.g. weighted by
    test-split size)."""
    _, params, part = tiny_workspace
    trainer = Trainer(params, REGISTRY[algorithm], part, mnist, paths.run_dir(algorithm, True),
                      paths.checkpoint_path(algorithm, True), ResultsDB(paths.RESULTS_DB), [paths.PARTITION], True)
    batch = params.train.eval_batch_size
    initial = mean_accuracy_by_hand(trainer.clients, batch)
    summary = trainer.run()
    blocks = [len(c.model.stages[0]) for c in trainer.clients]
    assert blocks == [1, 2, 3] and summary["setting"] == "hetero"
    history = dict(trainer.history)
    assert sorted(history) == [0, 1, 2]
    assert history[0] == pytest.approx(initial, rel=1e-12)
    assert summary["final_acc"] == history[2] == pytest.approx(mean_accuracy_by_hand(trainer.clients, batch), rel=1e-12)
    assert summary["maua"] == max(history.values())
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    rows = con.execute("SELECT client_id, acc, n_test FROM client_rounds WHERE run_id = ? AND round = 2 ORDER BY ALL",
                       [summary["run_id"]]).fetchall()
    con.close()
    assert rows == [(c.id, pytest.approx(accuracy_by_hand(c.model, c.x_test, c.y_test, batch), rel=1e-12), len(c.y_test))
                    for c in trainer.clients]


@pytest.mark.parametrize("name", [n for n in REGISTRY if registry.params_class(n).supports.heterogeneous is not True])
def test_config_refuses_homogeneous_only_methods_in_heterogeneous_runs(name):
    from conftest import tiny_params_raw
    from pipeline.config import parse_params

    assert name in ("fedavg", "fedalt", "mtfl", "pdfl", "pfedme")  # the parameter-sharing methods
    why = registry.params_class(name).supports.heterogeneous.why  # its declaration's reason, in the error
    with pytest.raises(ConfigError, match=re.escape(f"train.hetero_algorithms lists {name}, which {why}, so it needs")):
        parse_params(tiny_params_raw({"train": {"hetero_algorithms": [name]}}))
    with pytest.raises(ConfigError, match="needs the same model on every client"):  # its own stage checks it too
        parse_params(tiny_params_raw({"train": {"hetero_algorithms": [name]}}), methods=(name,))


def test_every_registered_method_has_its_params_section():
    import yaml

    from conftest import REPO_ROOT
    from pipeline.config import Params

    documented = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    for name in REGISTRY:
        assert name in Params.model_fields, f"pipeline/config.py has no `{name}` section"
        assert name in documented, f"params.yaml has no `{name}:` block"
