"""FedProto: aggregation (count / uniform / confidence), mean and median prototypes, ledger bytes = payload sizes on a tiny real run, both accuracy
readings recorded, the alignment adapter across feature sizes, and state round trip for resume."""

import copy
import math

import duckdb
import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_params_raw
from models.resnet import build_model
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.methods.fedproto.method import (FedProto, aggregate, aggregation_weights, class_prototypes,
                                          prototype_mse_rows)
from pipeline.federation.ledger import DOWN
from pipeline.config import ConfigError, parse_params
from pipeline.federation.clients import Client, to_tensor
from pipeline.federation.contract import ServerContext
from pipeline.train.engine import Simulation, Trainer
from pipeline.train.executors import SequentialExecutor
from pipeline.results.store import ResultsDB


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py), a quarter of the convolution:
    these runs check payloads, bytes and the server's arithmetic, not learning."""
    return small_mnist


# -- aggregation and prototypes -------------------------------------------------------------

# 3 clients, 3 classes, D = 2; class 1 is held by clients 0 and 2, class 2 by client 1 only
PROTOS = torch.tensor([
    [[1.0, 2.0], [10.0, 0.0], [0.0, 0.0]],
    [[3.0, 6.0], [0.0, 0.0], [5.0, 5.0]],
    [[7.0, 0.0], [20.0, 4.0], [0.0, 0.0]],
])
HELD = torch.tensor([[True, True, False], [True, False, True], [True, True, False]])
COUNTS = torch.tensor([[1, 3, 0], [2, 0, 4], [1, 1, 0]])
ACC = torch.tensor([[0.5, 1.0, 0.0], [0.9, 0.0, 0.2], [0.1, 0.3, 0.0]])


def test_count_weighted_mean_matches_hand_computation():
    g, has = aggregate(PROTOS, COUNTS, HELD, "count")
    # class 0: (1*[1,2] + 2*[3,6] + 1*[7,0]) / 4 ; class 1: (3*[10,0] + 1*[20,4]) / 4 ; class 2: client 1 alone
    torch.testing.assert_close(g, torch.tensor([[14 / 4, 14 / 4], [50 / 4, 4 / 4], [5.0, 5.0]]))
    assert has.tolist() == [True, True, True]


def test_uniform_mean_matches_hand_computation():
    g, _ = aggregate(PROTOS, COUNTS, HELD, "uniform")
    torch.testing.assert_close(g, torch.tensor([[11 / 3, 8 / 3], [15.0, 2.0], [5.0, 5.0]]))


def test_confidence_weights_are_softmax_of_accuracies_over_holders():
    w = aggregation_weights(COUNTS, HELD, "confidence", ACC)
    e = math.exp
    c0 = [e(0.5), e(0.9), e(0.1)]
    c1 = [e(1.0), e(0.3)]
    expected = torch.tensor([[c0[0] / sum(c0), c1[0] / sum(c1), 0.0],
                             [c0[1] / sum(c0), 0.0, 1.0],
                             [c0[2] / sum(c0), c1[1] / sum(c1), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(w, expected)
    g, _ = aggregate(PROTOS, COUNTS, HELD, "confidence", ACC)
    torch.testing.assert_close(g[1], (expected[0, 1] * PROTOS[0, 1] + expected[2, 1] * PROTOS[2, 1]).float())


def test_a_class_nobody_holds_is_absent():
    held = HELD.clone()
    held[1, 2] = False
    for how in ("count", "uniform", "confidence"):
        g, has = aggregate(PROTOS, COUNTS, held, how, ACC)
        assert has.tolist() == [True, True, False]
        assert torch.equal(g[2], torch.zeros(2))


def test_mean_and_median_prototypes():
    feats = torch.tensor([[1.0, 10.0], [5.0, 0.0], [2.0, 4.0],  # class 0 (odd count)
                          [1.0, 8.0], [4.0, 2.0], [3.0, 6.0], [2.0, 4.0],  # class 2 (even count)
                          [100.0, -100.0]])  # class 3, alone
    labels = torch.tensor([0, 0, 0, 2, 2, 2, 2, 3])
    mean, counts = class_prototypes(feats, labels, 5, "mean")
    assert counts.tolist() == [3, 0, 4, 1, 0]
    torch.testing.assert_close(mean[[0, 2, 3]], torch.tensor([[8 / 3, 14 / 3], [2.5, 5.0], [100.0, -100.0]]))
    assert torch.equal(mean[[1, 4]], torch.zeros(2, 2))
    median, _ = class_prototypes(feats, labels, 5, "median")
    # per dimension: class 0 -> sorted [1,2,5],[0,4,10]; class 2 -> lower median of [1,2,3,4],[2,4,6,8]
    torch.testing.assert_close(median[[0, 2, 3]], torch.tensor([[2.0, 4.0], [2.0, 4.0], [100.0, -100.0]]))
    # the outlier-robust property the extension is for: a wild sample moves the mean, not the median
    wild = torch.cat([feats, torch.tensor([[1e6, 1e6]])])
    wl = torch.cat([labels, torch.tensor([0])])
    assert class_prototypes(wild, wl, 5, "median")[0][0].abs().max() < 10
    assert class_prototypes(wild, wl, 5, "mean")[0][0].abs().max() > 1e5


def test_prototype_mse_skips_labels_without_a_global_prototype():
    z = torch.tensor([[1.0, 2.0], [3.0, 3.0], [0.0, 5.0]])
    y = torch.tensor([0, 1, 2])
    table = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    has = torch.tensor([True, True, False])
    # (1 + 4) + (4 + 4) over B*D = 6 entries; sample 2 has no prototype and adds nothing
    rows = prototype_mse_rows(z, table[y], has[y].float())
    torch.testing.assert_close(rows.sum() / len(y), torch.tensor(13 / 6))
    assert prototype_mse_rows(z, table[y], torch.zeros(3)).sum() == 0


# -- real runs on the tiny MNIST setting -------------------------------------------------------


def _trainer(tiny_workspace, mnist, fedproto: dict, hetero: bool = False):
    _, params, part = tiny_workspace
    params = params.model_copy(update={"fedproto": params.fedproto.model_copy(update=fedproto)})
    return Trainer(params, REGISTRY["fedproto"], part, mnist, paths.run_dir("fedproto"),
                   paths.checkpoint_path("fedproto"), ResultsDB(paths.RESULTS_DB), [paths.PARTITION], hetero)


@pytest.mark.parametrize("fedproto,hetero", [
    ({"eval": "classifier", "aggregation": "count"}, False),
    ({"encode_up": "topk:16", "eval": "prototype", "aggregation": "confidence"}, True),
], ids=["plain-homo", "topk-hetero"])
def test_bytes_equal_payload_sizes_and_both_readings_recorded(tiny_workspace, mnist, fedproto, hetero):
    _, _, part = tiny_workspace
    trainer = _trainer(tiny_workspace, mnist, fedproto, hetero)
    if hetero:  # A1/A2/A3 by client index: ResNet-8/16/20 share the 64-dim feature space
        assert [len(c.model.stages[0]) for c in trainer.clients] == [1, 2, 3]
    summary = trainer.run()
    algo = trainer.server
    D, K = 64, part.num_clients
    held = [np.unique(part.train_labels[part.train_offsets[k]:part.train_offsets[k + 1]]) for k in range(K)]
    c_global = len(np.unique(np.concatenate(held)))
    if "encode_up" in fedproto:
        per_class_up = 8 + 8 + 16 * (4 + 1) + 4  # ids, counts, 16 float32 values and their uint8 columns, accuracy
    else:
        per_class_up = 8 + 8 + 4 * D
    expected = [] if fedproto.get("align") else [(0, k, "up", "feature_dim", 4) for k in range(K)]  # set-up: its size
    for r in (1, 2):
        for k in range(K):
            expected.append((r, k, "up", "prototypes", len(held[k]) * per_class_up))
            if r == 2:  # nothing to download in round 1
                expected.append((r, k, "down", "prototypes", c_global * (8 + 4 * D)))
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ? ORDER BY ALL",
                       [summary["run_id"]]).fetchall()
    metrics = con.execute("SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY ALL",
                          [summary["run_id"]]).fetchall()
    rounds = dict(con.execute("SELECT round, mean_acc FROM rounds WHERE run_id = ?", [summary["run_id"]]).fetchall())
    con.close()
    assert sorted(rows) == sorted(expected)
    assert summary["bytes_total"] == sum(b for *_, b in expected)

    readings = {(r, name): v for r, name, v in metrics}
    assert {name for _, name in readings} == {"acc_classifier", "acc_prototype", "val_acc"}
    assert set(rounds) == {r for r, _ in readings} == {0, 1, 2}
    assert readings[(0, "acc_prototype")] == pytest.approx(readings[(0, "acc_classifier")])  # no prototypes yet
    used = "acc_prototype" if fedproto["eval"] == "prototype" else "acc_classifier"
    for r, mean in rounds.items():
        assert mean == pytest.approx(readings[(r, used)])
    # recompute the nearest-prototype reading of the last round by hand
    g, has = algo.global_protos, algo.global_has
    assert int(has.sum()) == c_global
    accs = []
    for c in trainer.clients:
        with torch.no_grad():
            c.model.eval()
            f = c.model.features(c.x_test)
        d = ((f[:, None, :] - g[None]) ** 2).sum(-1).masked_fill(~has, float("inf"))
        accs.append(float((d.argmin(1) == c.y_test).float().mean()))
    assert readings[(2, "acc_prototype")] == pytest.approx(np.mean(accs))
    if "encode_up" in fedproto:  # the server aggregates what it decoded: 16 values of each prototype, the rest 0
        assert ((algo.protos[algo.held] != 0).sum(1) <= 16).all()


# -- alignment across feature sizes and state round trip --------------------------------------


class TinyNet(nn.Module):
    """A different architecture with 32-dim features."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                  nn.Linear(128, 32), nn.ReLU())
        self.head = nn.Linear(32, num_classes)
        self.feature_dim = 32

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.head(self.features(x))


def _simulation(mnist, tmp_path, fedproto: dict, models: list[nn.Module], n: int = 40) -> Simulation:
    """FedProto over clients with the given (custom) models, set up (round 0 done)."""
    params = parse_params(tiny_params_raw({"fedproto": fedproto}))
    t = params.train
    clients = []
    for k, model in enumerate(models):
        torch.manual_seed(k)
        lo = k * n
        x, y = to_tensor(mnist.train_x[lo:lo + n]), torch.from_numpy(mnist.train_y[lo:lo + n]).long()
        xt, yt = to_tensor(mnist.test_x[lo:lo + n]), torch.from_numpy(mnist.test_y[lo:lo + n]).long()
        opt = torch.optim.SGD(model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        clients.append(Client(k, model, opt, x, y, torch.arange(lo, lo + n), xt, yt, xt[:0], yt[:0]))
    ctx = ServerContext(params, len(clients), mnist.num_classes, mnist.input_shape, None, torch.device("cpu"), tmp_path,
                        hetero=True)
    sim = Simulation(FedProto, clients, ctx, SequentialExecutor())
    sim.setup()
    return sim


def _mixed_models(mnist):
    torch.manual_seed(0)
    return [TinyNet(1, mnist.num_classes), build_model("resnet8", 1, mnist.num_classes)]


def test_align_lets_clients_with_different_feature_sizes_share_prototypes(mnist, tmp_path):
    """A 32-feature and a 64-feature client share 16-dim prototypes through their adapters. Fails if a global
    prototype is not the count-weighted mean, a download is counted at another size, the adapters do not train,
    or the prototype reading takes another prototype than the nearest one to the aligned embedding."""
    with pytest.raises(ConfigError, match="align"):
        _simulation(mnist, tmp_path, {"align": False}, _mixed_models(mnist))
    sim = _simulation(mnist, tmp_path, {"align": True, "align_dim": 16}, _mixed_models(mnist))
    algo = sim.server
    adapters = [c.model.adapter for c in sim.clients]  # part of each client's model, trained by its optimizer
    assert [a[0].in_features for a in adapters] == [32, 64]
    torch.testing.assert_close(adapters[0][2].weight, adapters[1][2].weight)  # common initialisation
    before = [copy.deepcopy(a.state_dict()) for a in adapters]
    sim.run_round(1, [0, 1])
    assert algo.protos.shape == (2, mnist.num_classes, 16)
    for c in sim.clients:  # each client uploaded a 16-dim prototype for every class it holds
        assert torch.nonzero(algo.held[c.id]).flatten().tolist() == c.y_train.unique().tolist()
    shared = algo.held[0] & algo.held[1]
    assert shared.any()
    # the global prototype of a shared class is the count-weighted mean of the two clients' 16-dim prototypes
    w = algo.counts[:, shared].float() / algo.counts[:, shared].sum(0)
    torch.testing.assert_close(algo.global_protos[shared], (w.unsqueeze(-1) * algo.protos[:, shared]).sum(0))
    sim.run_round(2, [0, 1])
    downs = {k: b for _, k, d, _, b, _ in sim.ledger.rows(2) if d == DOWN}
    assert downs == {0: int(algo.global_has.sum()) * (8 + 4 * 16), 1: int(algo.global_has.sum()) * (8 + 4 * 16)}
    # the adapters were trained (the MSE term reaches them from round 2 on)
    assert not torch.equal(before[0]["0.weight"], adapters[0][0].weight)
    assert not torch.equal(before[1]["0.weight"], adapters[1][0].weight)
    # both readings written out: the classifier's argmax, and the class of the nearest global prototype to each
    # test sample's aligned embedding (its adapter over its own features), in float64 (fails if a reading takes
    # another prototype than the nearest, is measured on other samples, or in train mode: BatchNorm's batch
    # statistics)
    rows, extras = sim.evaluate(2)
    classes = torch.nonzero(algo.global_has).flatten()
    protos = algo.global_protos[classes].double()
    by_hand = {"acc_classifier": [], "acc_prototype": []}
    with torch.no_grad():
        for c in sim.clients:
            c.model.eval()
            f = c.model.features(c.x_test)
            by_hand["acc_classifier"].append((c.model.head(f).argmax(1) == c.y_test).double().mean().item())
            nearest = torch.cdist(c.model.adapter(f).double(), protos).argmin(1)
            by_hand["acc_prototype"].append((classes[nearest] == c.y_test).double().mean().item())
    assert len(rows) == 2 and extras == {k: pytest.approx(sum(v) / 2, rel=1e-12) for k, v in by_hand.items()}


@pytest.mark.parametrize("reading", ["classifier", "prototype"])
def test_round_figure_follows_the_eval_param(mnist, tmp_path, reading):
    torch.manual_seed(0)
    sim = _simulation(mnist, tmp_path, {"eval": reading}, [build_model("resnet8", 1, mnist.num_classes) for _ in range(2)])
    algo = sim.server
    rows, extras = sim.evaluate(0)  # no global prototypes: the prototype reading falls back to the classifier
    assert extras["acc_prototype"] == extras["acc_classifier"]
    with torch.no_grad():
        classifier = [float((c.model.eval()(c.x_test).argmax(1) == c.y_test).float().mean()) for c in sim.clients]
    # one global prototype (class 1): every test sample is predicted as class 1
    algo.global_has[1] = True
    algo.global_protos[1] = torch.randn(64)
    prototype = [float((c.y_test == 1).float().mean()) for c in sim.clients]
    assert prototype != classifier  # the two readings differ here, so the check below can tell them apart
    rows, extras = sim.evaluate(1)
    assert [r[0] for r in rows] == [0, 1] and [r[2] for r in rows] == [40, 40]
    assert [r[1] for r in rows] == pytest.approx(prototype if reading == "prototype" else classifier)
    assert extras == pytest.approx({"acc_classifier": np.mean(classifier), "acc_prototype": np.mean(prototype)})


def test_state_dict_round_trip_resumes_exactly(mnist, tmp_path):
    # deltas both ways: the copies each sender keeps of what its receivers decoded must come back too
    fedproto = {"align": True, "align_dim": 16, "encode_up": "delta:0.01+int8", "encode_down": "delta:0.01",
                "aggregation": "confidence"}
    sim = _simulation(mnist, tmp_path, fedproto, _mixed_models(mnist))
    algo = sim.server
    sim.run_round(1, [0, 1])
    sim.run_round(2, [0])  # partial participation: client 1's round-1 upload stays in use
    saved_algo = copy.deepcopy(algo.state_dict())
    saved_clients = [(copy.deepcopy(c.model.state_dict()), copy.deepcopy(c.optimizer.state_dict()), copy.deepcopy(c.state))
                     for c in sim.clients]
    sim.run_round(3, [0, 1])
    rows, extras = sim.evaluate(3)

    sim2 = _simulation(mnist, tmp_path, fedproto, _mixed_models(mnist))
    resumed = sim2.server
    resumed.load_state_dict(saved_algo)
    for c, (m, o, st) in zip(sim2.clients, saved_clients):
        c.model.load_state_dict(m)
        c.optimizer.load_state_dict(o)
        c.state = st
    adapter_weight = sim2.clients[0].model.adapter[0].weight
    assert "momentum_buffer" in sim2.clients[0].optimizer.state[adapter_weight]  # the adapter's momentum came back
    sim2.run_round(3, [0, 1])
    rows2, extras2 = sim2.evaluate(3)
    assert rows2 == rows and extras2 == extras
    for name, value in algo.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed.state_dict()[name]), name
    for c1, c2 in zip(sim.clients, sim2.clients):
        for (n, p), (_, q) in zip(c1.model.adapter.state_dict().items(), c2.model.adapter.state_dict().items()):
            assert torch.equal(p, q), n
    for c1, c2 in zip(sim.clients, sim2.clients):
        for p, q in zip(c1.model.parameters(), c2.model.parameters()):
            assert torch.equal(p, q)
