"""pDFL: the peer graph, attention-weighted aggregation, the class teachers, bytes per directed
edge on a tiny real run, the switches, and an exact resume."""

import json
import math

import duckdb
import numpy as np
import pytest
import torch

from pipeline import paths
from pipeline.algorithms import REGISTRY
from pipeline.algorithms.pdfl import (aggregate_bodies, attention_weights, body_state, class_teachers,
                                      representations)
from pipeline.config import ConfigError, PDFLParams
from pipeline.engine import Trainer
from pipeline.losses import soft_kd_rows
from pipeline.results import ResultsDB
from pipeline.topology import Topology, is_connected


# -- topology ------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_static_graph_is_connected_with_min_degree_and_seeded(seed):
    p = PDFLParams(edge_prob=0.25, min_degree=2)
    topo = Topology(20, p, seed)
    adj = topo.base
    assert (adj == adj.T).all() and not adj.diagonal().any()
    assert adj.sum(axis=1).min() >= 2 and is_connected(adj)
    assert (Topology(20, p, seed).base == adj).all()  # deterministic for a seed
    assert topo.edges(1).tolist() == topo.edges(7).tolist()  # static: the same every round
    nbrs = topo.in_neighbours(3)
    assert all(sorted(np.flatnonzero(adj[:, i]).tolist()) == nbrs[i].tolist() for i in range(20))


def test_different_seeds_give_different_graphs():
    p = PDFLParams(edge_prob=0.3, min_degree=1)
    assert not (Topology(20, p, 0).base == Topology(20, p, 1).base).all()


def test_impossible_graph_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"pdfl\.edge_prob.*pdfl\.min_degree.*pdfl\.max_redraws = 1"):
        Topology(30, PDFLParams(edge_prob=0.01, min_degree=2, max_redraws=1), 0)
    with pytest.raises(ConfigError, match=r"pdfl\.min_degree = 3.*only 3 clients"):
        Topology(3, PDFLParams(edge_prob=1.0, min_degree=3), 0)


def test_redraw_gives_a_fresh_valid_graph_each_round():
    p = PDFLParams(edge_prob=0.3, min_degree=2, topology="redraw")
    topo, again = Topology(15, p, 4), Topology(15, p, 4)
    graphs = [topo.edges(r) for r in (1, 2, 3)]
    assert any(g.tolist() != graphs[0].tolist() for g in graphs[1:])
    for r, g in zip((1, 2, 3), graphs):
        adj = np.zeros((15, 15), dtype=bool)
        adj[g[:, 0], g[:, 1]] = True
        assert (adj == adj.T).all() and adj.sum(axis=0).min() >= 2 and is_connected(adj)
        assert again.edges(r).tolist() == g.tolist()  # keyed by (seed, round): resumable
    assert sorted(json.loads(json.dumps(topo.to_json()))["rounds"]) == ["1", "2", "3"]


def test_subsample_takes_a_seeded_subset_of_each_clients_neighbours():
    p = PDFLParams(edge_prob=0.5, min_degree=2, topology="subsample", subsample_fraction=0.5)
    topo = Topology(12, p, 1)
    base = topo.base
    rounds = [topo.in_neighbours(r) for r in (1, 2)]
    for nbrs in rounds:
        for i, js in enumerate(nbrs):
            assert base[js, i].all()  # a subset of the static neighbours
            assert len(js) == max(1, math.ceil(0.5 * base[:, i].sum()))
    assert any(a.tolist() != b.tolist() for a, b in zip(*rounds))
    assert [a.tolist() for a in Topology(12, p, 1).in_neighbours(2)] == [a.tolist() for a in rounds[1]]


# -- attention, teachers, aggregation ----------------------------------------------------

def _knowledge(classes, C=10, sharp=0.9, seed=0):
    """Soft [C, C] of a client holding `classes` (mostly right predictions) and its counts."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(C, dtype=torch.int64)
    counts[classes] = torch.randint(10, 30, (len(classes),), generator=g)
    soft = torch.zeros(C, C)
    noise = torch.rand(len(classes), C, generator=g)
    rows = (1 - sharp) * noise / noise.sum(1, keepdim=True)
    rows[torch.arange(len(classes)), torch.tensor(classes)] += sharp
    soft[classes] = rows
    return soft, counts


def test_attention_weights_sum_to_one_and_drop_a_mismatched_neighbour():
    own = _knowledge([0, 1, 2, 3, 4], seed=0)
    peers = [_knowledge([0, 1, 2, 3, 4], seed=1), _knowledge([0, 1, 2, 3, 5], seed=2),
             _knowledge([5, 6, 7, 8, 9], seed=3)]  # two like the client, one with disjoint classes
    soft = torch.stack([own[0]] + [s for s, _ in peers])
    counts = torch.stack([own[1]] + [c for _, c in peers])
    reps = representations(soft, counts)
    for heads in (1, 4, 7):
        w = attention_weights(reps[0], reps[1:], heads)
        assert w.sum().item() == pytest.approx(1.0, abs=1e-6) and (w > 0).all()
        assert int(w.argmin()) == 2 and w[2] < 1 / 3  # the disjoint-class peer
        assert w[0] > 1 / 3  # the most similar peer gets more than uniform


def test_class_teachers_top_k_and_calibration():
    C = 3
    soft = torch.tensor([
        [[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.0, 0.0, 0.0]],  # peer 0: classes 0, 1
        [[0.6, 0.3, 0.1], [0.6, 0.3, 0.1], [0.0, 0.0, 0.0]],  # peer 1: classes 0, 1 (wrong on 1)
        [[0.2, 0.2, 0.6], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],  # peer 2: class 0 only, wrong
    ])
    counts = torch.tensor([[5, 5, 0], [5, 5, 0], [5, 0, 0]])
    w = torch.tensor([0.2, 0.5, 0.3])
    t = class_teachers(soft, counts, w, top_k=2)
    # class 0: top-2 holders by weight are peers 1 and 2
    assert torch.allclose(t[0], (0.5 * soft[1, 0] + 0.3 * soft[2, 0]) / 0.8)
    assert torch.allclose(t[1], (0.2 * soft[0, 1] + 0.5 * soft[1, 1]) / 0.7)  # only two hold class 1
    assert torch.isnan(t[2]).all()  # nobody holds class 2
    cal = class_teachers(soft, counts, w, top_k=2, calibrate=True)
    assert torch.allclose(cal[0], t[0])  # argmax already right
    assert torch.allclose(cal[1], t[1][[1, 0, 2]])  # argmax was 0: the probabilities of 0 and 1 swapped
    assert cal[1].argmax() == 1 and torch.allclose(cal[:2].sum(1), torch.ones(2))
    full = class_teachers(soft, counts, w)
    assert torch.allclose(full[0], (0.2 * soft[0, 0] + 0.5 * soft[1, 0] + 0.3 * soft[2, 0]))


def test_soft_kd_is_zero_at_the_teacher_and_skips_missing_rows():
    T = 3.0
    logits = torch.randn(4, 5)
    teacher = torch.softmax(logits / T, dim=1)
    teacher[1] = float("nan")
    rows = soft_kd_rows(logits, teacher, T)
    assert rows[1] == 0 and rows.abs().max().item() == pytest.approx(0.0, abs=1e-6)
    assert soft_kd_rows(logits + torch.randn(4, 5), teacher, T).sum().item() > 0


def test_aggregation_is_the_weighted_mean_of_the_bodies():
    from models.resnet import build_model

    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(build_model("resnet8", 1, 10))
    states = [body_state(m) for m in models]
    assert states[0] and all(n.startswith(("stem.", "stages.")) for n in states[0])
    assert not any(n.startswith("head.") for n in states[0])
    states[1]["stem.1.num_batches_tracked"] = torch.tensor(7)
    w = torch.tensor([0.25, 0.75])
    out = aggregate_bodies(states[0], states[1:], w, self_weight=0.4)
    for name, mine in states[0].items():
        if mine.is_floating_point():
            expected = 0.4 * mine.double() + 0.6 * (0.25 * states[1][name].double() + 0.75 * states[2][name].double())
            assert torch.allclose(out[name].double(), expected, atol=1e-6), name
        else:
            assert torch.equal(out[name], mine)  # counters stay the client's own
    assert all(torch.equal(a, b) for a, b in zip(aggregate_bodies(states[0], states[1:], w, 1.0).values(),
                                                 states[0].values()))


# -- real runs on the tiny workspace --------------------------------------------------------

def _params(params, rounds=2, **pdfl):
    return params.model_copy(update={
        "train": params.train.model_copy(update={"rounds": rounds}),
        "pdfl": params.pdfl.model_copy(update={"edge_prob": 1.0, "min_degree": 1, **pdfl}),
    })


def _trainer(params, part, mnist, ckpt="pdfl.pt"):
    return Trainer(params, REGISTRY["pdfl"], part, mnist, paths.run_dir("pdfl"), paths.CHECKPOINTS / ckpt,
                   ResultsDB(paths.RESULTS_DB), [paths.PARTITION])


def test_bytes_equal_payload_sizes_per_directed_edge(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params), part, mnist)
    summary = trainer.run()
    C = part.num_classes
    body = sum(t.numel() * t.element_size() for t in body_state(trainer.ctx.clients[0].model).values())
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes, peer_id FROM comm WHERE run_id = ? "
                       "ORDER BY ALL", [summary["run_id"]]).fetchall()
    extras = con.execute("SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY ALL",
                         [summary["run_id"]]).fetchall()
    con.close()
    expected = []
    for r in (1, 2):
        for j in range(3):
            for i in range(3):
                if i != j:  # complete graph on 3 clients: 6 directed edges
                    expected += [(r, j, "up", "body", body, i), (r, j, "up", "knowledge", C * C * 4 + C * 8, i)]
    assert sorted(rows) == sorted(expected)
    assert summary["bytes_total"] == 2 * 6 * (body + C * C * 4 + C * 8) and summary["bytes_down"] == 0
    topo = json.loads((paths.run_dir("pdfl") / "topology.json").read_text())
    assert topo["base_edges"] == [[0, 1], [0, 2], [1, 2]] and topo["kind"] == "static"
    assert 0 < summary["maua"] <= 1
    assert [(r, v) for r, n, v in extras if n == "edges"] == [(1, 6.0), (2, 6.0)]


@pytest.mark.parametrize("switch", [
    {"attention": False}, {"internal_kd": False}, {"external_kd": False},
    {"internal_kd": False, "external_kd": False, "order": "body_then_head"},
])
def test_switches_run(tiny_workspace, mnist, switch):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params, rounds=1, **switch), part, mnist)
    heads_before = [c.model.head.weight.detach().clone() for c in trainer.ctx.clients]
    summary = trainer.run()
    assert 0 <= summary["final_acc"] <= 1
    assert all(not torch.equal(h, c.model.head.weight) for h, c in zip(heads_before, trainer.ctx.clients))
    weights = trainer.algorithm.last_weights
    assert sorted(weights) == [0, 1, 2]
    for i, (nbrs, w) in weights.items():
        assert sorted(nbrs) == sorted({0, 1, 2} - {i}) and sum(w) == pytest.approx(1.0)
        if switch.get("attention") is False:
            assert w == pytest.approx([0.5, 0.5])


def test_bodies_start_common_and_heads_personal(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params), part, mnist)
    heads = [c.model.head.weight.detach().clone() for c in trainer.ctx.clients]
    trainer.start()  # round 0
    bodies = [body_state(c.model) for c in trainer.ctx.clients]
    assert all(torch.equal(bodies[0][n], b[n]) for b in bodies[1:] for n in b)
    assert all(torch.equal(h, c.model.head.weight) for h, c in zip(heads, trainer.ctx.clients))
    assert not torch.equal(heads[0], heads[1])
    assert (trainer.algorithm.counts.sum(1) == torch.from_numpy(np.diff(part.train_offsets))).all()
    assert torch.allclose(trainer.algorithm.soft.sum(2)[trainer.algorithm.counts > 0], torch.tensor(1.0))
    assert trainer.ctx.ledger.total() == 0


def test_resume_is_exact_with_a_time_varying_graph(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    p = _params(params, rounds=3, topology="subsample", subsample_fraction=0.5)
    reference = _trainer(p, part, mnist, "reference.pt")
    reference.run()

    first = _trainer(p, part, mnist)
    first.start()
    first.run_round(1)
    first.run_round(2)  # checkpointed; "crash" here
    resumed = _trainer(p, part, mnist)
    assert resumed.start() == 3
    assert resumed.algorithm.topology.history.keys() == {1, 2}
    resumed.run_round(3)
    for a, b in zip(reference.ctx.clients, resumed.ctx.clients):
        for (n, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
            assert torch.equal(x, y), n
    assert torch.equal(reference.algorithm.soft, resumed.algorithm.soft)
    assert reference.ctx.ledger.state_dict() == resumed.ctx.ledger.state_dict()
    assert reference.algorithm.topology.to_json() == resumed.algorithm.topology.to_json()


def test_heterogeneous_models_are_refused():
    from types import SimpleNamespace

    from pipeline.algorithms.pdfl import PDFL

    with pytest.raises(ConfigError, match="train.hetero_algorithms"):
        PDFL(SimpleNamespace(hetero=True))
