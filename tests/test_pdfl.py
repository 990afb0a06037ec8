"""pDFL: the peer graph (and the default / paper presets), the learned attention, the internal
teacher, bytes per directed edge (model copies, knowledge, feedback) on a tiny real run, the
attention round metrics, the switches, and an exact resume."""

import copy
import json
import math
import shutil

import duckdb
import numpy as np
import pytest
import torch

from conftest import unit_tier_first, with_section
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.methods.pdfl.method import (attention_weights, calibrate, init_projections, internal_teacher,
                                      mixture_nll, model_state, ranked, train_attention)
from pipeline.config import ConfigError, parse_params
from pipeline.methods.pdfl.params import PDFLParams
from pipeline.train.engine import Trainer
from pipeline.federation.losses import soft_kd_rows
from pipeline.results.store import ResultsDB
from pipeline.methods.pdfl.topology import Topology, is_connected
from test_peers import mean_accuracy_by_hand


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests check what is computed and sent, not accuracy."""
    return small_mnist



# -- topology ------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_static_graph_is_connected_with_min_degree_and_seeded(seed):
    p = PDFLParams(edge_prob=0.25, min_degree=2, topology="static")
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


# -- attention ---------------------------------------------------------------------------

def _reps(m, D=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(m + 1, D, generator=g)
    return r[0], r[1:]


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_attention_weights_are_a_distribution_and_start_near_uniform(heads):
    query, keys = _reps(5)
    wq, wk = init_projections(9, heads, seed=0, client=3)
    assert wq.shape == (heads, math.ceil(9 / heads), 9) and not torch.equal(wq, wk)
    assert torch.equal(wq, init_projections(9, heads, seed=0, client=3)[0])  # seeded per client
    w = attention_weights(query, keys, wq, wk)
    assert w.shape == (5,) and (w - 0.2).abs().max() < 0.01  # the small init: nearly uniform before any training
    # written out in float64: r standardised (zero mean, unit norm), per head softmax_j(<W_q r_i, W_k r_j> / sqrt(d_h)),
    # the mean over heads; at the init and with projections 30x larger (far from uniform, as after training).
    # Fails if the scores are not scaled by 1/sqrt(d_h), the softmax runs over heads instead of neighbours, a
    # representation is not standardised, or the query and key projections are swapped.
    def by_hand(wq, wk):
        def standardised(r):
            r = r.double()
            c = r - r.mean()
            return c / math.sqrt(float((c * c).mean()) + 1e-5) / math.sqrt(len(r))

        q, ks = standardised(query), [standardised(k) for k in keys]
        per_head = []
        for h in range(heads):
            scores = [float((wq[h].double() @ q) @ (wk[h].double() @ k)) / math.sqrt(wq.shape[1]) for k in ks]
            e = [math.exp(a - max(scores)) for a in scores]
            per_head.append([a / sum(e) for a in e])
        return [sum(col) / heads for col in zip(*per_head)]

    for scale in (1, 30):  # the method run in float64 (its projections' dtype)
        q64, k64 = scale * wq.double(), scale * wk.double()
        assert attention_weights(query, keys, q64, k64).tolist() == pytest.approx(by_hand(q64, k64), rel=1e-12,
                                                                                   abs=1e-300), scale
    assert max(by_hand(30 * wq.double(), 30 * wk.double())) > 0.3  # far from uniform: the terms show


def test_attention_projections_learn_to_trust_the_neighbour_that_fits_the_labels():
    query, keys = _reps(3, seed=1)
    n = 40
    fit = torch.stack([torch.full((n,), 0.2), torch.full((n,), 0.9), torch.full((n,), 0.3)])  # p_j(x)[y]
    fit[0, :5] = float("nan")  # NaN-safe
    wq, wk = init_projections(9, 2, seed=0, client=0)
    before = attention_weights(query, keys, wq, wk)
    wq2, wk2 = train_attention(query, keys, fit, wq, wk, steps=30, lr=0.05)
    after = attention_weights(query, keys, wq2, wk2)
    assert not torch.equal(wq2, wq) and not torch.equal(wk2, wk)
    assert int(after.argmax()) == 1 and after[1] > before[1] + 0.2
    assert mixture_nll(after, fit) < mixture_nll(before, fit)
    assert torch.isfinite(after).all() and after.sum().item() == pytest.approx(1.0, abs=1e-6)
    # no steps: nothing learned
    same = train_attention(query, keys, fit, wq, wk, steps=0, lr=0.05)
    assert torch.equal(same[0], wq) and torch.equal(same[1], wk)


# -- teachers ----------------------------------------------------------------------------

def test_internal_teacher_is_the_calibrated_mixture_of_the_top_k_neighbours():
    probs = torch.tensor([
        [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]],  # neighbour 0 on the client's two samples
        [[0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],  # neighbour 1 (lowest weight: not in the top 2)
        [[0.3, 0.3, 0.4], [0.1, 0.1, 0.8]],  # neighbour 2
    ])
    w = torch.tensor([0.5, 0.2, 0.3])
    y = torch.tensor([0, 1])
    t = internal_teacher(probs, w, y, top_k=2)
    # by hand: weights 0.5 and 0.3 renormalised to 0.625 / 0.375
    assert torch.allclose(t[0], torch.tensor([0.4875, 0.3, 0.2125]))  # argmax 0 = y: unchanged
    assert torch.allclose(t[1], torch.tensor([0.1625, 0.4875, 0.35]))  # argmax 2 != y = 1: swapped
    assert (t >= 0).all() and torch.allclose(t.sum(1), torch.ones(2)) and (t.argmax(1) == y).all()
    other = probs.clone()
    other[1] = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert torch.equal(internal_teacher(other, w, y, top_k=2), t)  # not chosen: no influence
    everyone = internal_teacher(probs, w, y, top_k=5)  # top_k >= neighbours: all of them
    assert torch.allclose(everyone, calibrate((w[:, None, None] * probs).sum(0), y))
    # uniform weights (attention off): ties go to the lower client index
    assert ranked(torch.full((4,), 0.25), 2).tolist() == [0, 1]


def test_soft_kd_is_zero_at_the_teacher_and_skips_missing_rows():
    T = 3.0
    gen = torch.Generator().manual_seed(0)  # seeded: the same draw on every run
    logits = torch.randn(4, 5, generator=gen)
    teacher = torch.softmax(logits / T, dim=1)
    teacher[1] = float("nan")
    rows = soft_kd_rows(logits, teacher, T)
    # zero up to float32 rounding, which T^2 = 9 scales (an unseeded draw once gave 1.3e-6)
    assert rows[1] == 0 and rows.abs().max().item() == pytest.approx(0.0, abs=1e-5)
    # another student, by hand in float64: T^2 * sum_c q_c (log q_c - log softmax(s / T)_c), 0 for the NaN row
    # (fails if the T^2 factor, the teacher's entropy term or the student's temperature is left out)
    student = logits + torch.randn(4, 5, generator=gen)
    got = soft_kd_rows(student, teacher, T)
    for i in range(4):
        q, s = teacher[i].double().tolist(), (student[i].double() / T).tolist()
        log_p = [a - math.log(sum(math.exp(b) for b in s)) for a in s]
        expected = 0.0 if i == 1 else T * T * sum(qc * (math.log(qc) - lp) for qc, lp in zip(q, log_p))
        assert float(got[i]) == pytest.approx(expected, rel=1e-5, abs=1e-6), i



def test_peer_copies_trained_together_equal_one_after_another():
    """external_copies (one grouped network, the vectorized executor) = external_copy per job, in float64,
    with clients of different sizes: one smaller than a batch, so its rows are padded and masked."""
    from conftest import tiny_params_raw
    from models.resnet import build_model
    from pipeline.methods.pdfl.method import CopyJob, external_copies, external_copy
    from pipeline.seeds import torch_generator

    params = parse_params(tiny_params_raw({"train": {"batch_size": 8}, "pdfl": {"external_steps": 4}}))
    torch.manual_seed(0)
    template = build_model("resnet8", 1, 10).double()

    def jobs():
        out = []
        for i, n in enumerate((20, 5, 12)):
            data = torch.Generator().manual_seed(i)
            torch.manual_seed(1 + i)  # the same peer each time jobs() is called
            peer = build_model("resnet8", 1, 10).double()
            x = torch.randn(n, 1, 14, 14, generator=data, dtype=torch.float64)
            y = torch.randint(0, 10, (n,), generator=data)
            teacher = torch.softmax(torch.randn(n, 10, generator=data, dtype=torch.float64), dim=1)
            out.append(CopyJob(model_state(peer), x, y, teacher, torch_generator(0, "pdfl-external", 1, i, 0)))
        return out

    one_by_one = [external_copy(copy.deepcopy(template), job, params) for job in jobs()]
    together = external_copies(template, jobs(), params)
    assert len(together) == 3
    for a, b in zip(one_by_one, together):
        assert a.keys() == b.keys()
        for name in a:
            assert torch.allclose(a[name].double(), b[name].double(), rtol=1e-9, atol=1e-10), name
        moved = [n for n in a if a[n].is_floating_point() and not torch.equal(a[n], model_state(template)[n])]
        assert moved  # the copies really trained

# -- params and presets ----------------------------------------------------------------------

@pytest.mark.parametrize("key,value", [("external_peers", 0), ("attention_steps", -1), ("external_steps", 0),
                                       ("attention_lr", 0), ("top_k", 0)])
def test_bad_pdfl_values_are_clear_errors(key, value):
    from conftest import tiny_params_raw
    from pipeline.config import parse_params

    with pytest.raises(ConfigError, match=rf"pdfl\.{key}"):
        parse_params(tiny_params_raw({"pdfl": {key: value}}))


def test_self_weight_is_gone():
    from conftest import tiny_params_raw
    from pipeline.config import parse_params

    with pytest.raises(ConfigError, match=r"pdfl\.self_weight.*unknown key"):
        parse_params(tiny_params_raw({"pdfl": {"self_weight": 0.5}}))


def _pdfl_section(preset: str | None = None) -> tuple[PDFLParams, int]:
    import yaml

    from conftest import REPO_ROOT

    raw = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    section, K = dict(raw["pdfl"]), raw["partition"]["num_clients"]
    if preset:
        over = yaml.safe_load((REPO_ROOT / "presets" / f"{preset}.yaml").read_text())
        section.update(over.get("pdfl", {}))
        K = over.get("partition", {}).get("num_clients", K)
    return PDFLParams(**section), K


@pytest.mark.parametrize("preset,K,degree", [(None, 20, 4), ("pdfl_paper", 100, 10)])
def test_default_and_paper_topologies_draw_within_max_redraws(preset, K, degree):
    p, k = _pdfl_section(preset)
    assert k == K and p.min_degree == degree and p.topology == "redraw"
    for seed in (0, 1):
        topo = Topology(K, p, seed)  # a ConfigError if no draw within max_redraws
        for r in range(1, 6):
            nbrs = topo.in_neighbours(r)
            assert min(len(n) for n in nbrs) >= degree
            assert topo.draws[r] <= p.max_redraws
    if preset is None:  # scaled down for `make run`: about 6-8 neighbours
        assert 6 <= p.edge_prob * (K - 1) <= 8


def test_paper_preset_is_a_valid_params_override():
    from pipeline.experiments.presets import check

    from conftest import REPO_ROOT

    flat = check("pdfl_paper", REPO_ROOT / "params.yaml", REPO_ROOT / "presets")
    assert flat == {"partition.num_clients": 100, "pdfl.order": "head_then_body", "pdfl.edge_prob": 0.2,
                    "pdfl.min_degree": 10, "pdfl.topology": "redraw"}


# -- real runs on the tiny workspace --------------------------------------------------------

def _params(params, rounds=2, **pdfl):
    return params.model_copy(update={
        "train": params.train.model_copy(update={"rounds": rounds}),
        "pdfl": params.pdfl.model_copy(update={"edge_prob": 1.0, "min_degree": 1, "topology": "static", **pdfl}),
    })


def _trainer(params, part, mnist, ckpt="pdfl.pt"):
    return Trainer(params, REGISTRY["pdfl"], part, mnist, paths.run_dir("pdfl"), paths.CHECKPOINTS / ckpt,
                   ResultsDB(paths.RESULTS_DB), [paths.PARTITION])


def _query(sql, run_id):
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    try:
        return con.execute(sql, [run_id]).fetchall()
    finally:
        con.close()


def _nbytes(state):
    return sum(t.numel() * t.element_size() for t in state.values())


def test_bytes_per_directed_edge_with_feedback_delivered_next_round(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params, external_peers=1), part, mnist)
    trainer.start()
    start = [model_state(c.model) for c in trainer.clients]  # what travels in round 1
    trainer.run_round(1)
    top = {i: nbrs[int(torch.tensor(w).argmax())] for i, (nbrs, w) in trainer.server.last_weights.items()}
    pending = trainer.server.feedback
    assert {(i, j) for j, by in pending.items() for i in by} == {(i, j) for i, j in top.items()}
    for j, by in pending.items():
        for i, state in by.items():  # i optimised j's round-1 copy: it differs from what i received
            assert state.keys() == start[j].keys()
            assert any(not torch.equal(state[n], start[j][n]) for n in state if state[n].is_floating_point())
    trainer.run_round(2)
    summary = trainer.finish()
    C = part.num_classes
    model = _nbytes(start[0])
    rows = _query("SELECT round, client_id, direction, kind, bytes, peer_id FROM comm WHERE run_id = ? ORDER BY ALL",
                  summary["run_id"])
    expected = []
    for r in (1, 2):
        for j in range(3):
            for i in range(3):
                if i != j:  # complete graph on 3 clients: 6 directed edges
                    expected += [(r, j, "up", "model", model, i), (r, j, "up", "knowledge", C * C * 4 + C * 8, i)]
    # round-1 feedback, counted on delivery (round 2) on the edge i -> j
    expected += [(2, i, "up", "feedback", model, j) for i, j in top.items()]
    assert sorted(rows) == sorted(expected)
    assert summary["bytes_down"] == 0
    extras = _query("SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY ALL", summary["run_id"])
    assert [(r, v) for r, n, v in extras if n == "feedback_delivered"] == [(1, 0.0), (2, 3.0)]
    assert [(r, v) for r, n, v in extras if n == "edges"] == [(1, 6.0), (2, 6.0)]
    topo = json.loads((paths.run_dir("pdfl") / "topology.json").read_text())
    assert topo["base_edges"] == [[0, 1], [0, 2], [1, 2]] and topo["kind"] == "static"
    # the run's figures are each client's own model on its own test split, written out (fails if a client is
    # evaluated with a peer's copy, a feedback copy or on its training samples)
    history = dict(trainer.history)
    assert summary["final_acc"] == history[2] == pytest.approx(
        mean_accuracy_by_hand(trainer.clients, params.train.eval_batch_size), rel=1e-12)
    assert summary["maua"] == max(history.values())


def test_the_body_phase_teacher_is_the_mean_of_the_delivered_feedback_copies(tiny_workspace, mnist):
    """Round 2's external teacher on a client's samples, by hand: softmax(F(x) / T) of every feedback copy the
    network delivers to it (its peers' round-1 optimisation of its round-0 model), averaged; not calibrated."""
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params), part, mnist)
    trainer.start()
    trainer.run_round(1)
    delivered = {j: dict(by) for j, by in trainer.server.feedback.items()}
    downloads = trainer.server.configure(2, [0, 1, 2])
    client = trainer.clients[0]
    targets = trainer.sim.local.begin(client, downloads[0], 2)
    T = params.pdfl.T
    scratch = copy.deepcopy(client.model).eval()
    by_hand = []
    with torch.no_grad():
        for _, state in sorted(delivered[0].items()):
            scratch.load_state_dict(state)
            by_hand.append(torch.softmax(scratch(client.x_train) / T, dim=1))
    assert len(by_hand) == params.pdfl.external_peers
    torch.testing.assert_close(targets["external"], torch.stack(by_hand).mean(dim=0))


def test_no_feedback_without_external_kd(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params, external_kd=False), part, mnist)
    summary = trainer.run()
    assert trainer.server.feedback == {}
    kinds = {k for (k,) in _query("SELECT DISTINCT kind FROM comm WHERE run_id = ?", summary["run_id"])}
    assert kinds == {"model", "knowledge"}


def test_attention_weights_and_teacher_diagnostics_are_round_metrics(tiny_workspace, mnist):
    """The teacher diagnostics written out from the models that travelled: round r's student_acc is each
    client's round-start model on its own training samples; internal_teacher_acc the argmax of the top_k
    mixture (the round's attention weights, as recorded) of its neighbours' round-start models' softmax(M(x) / T),
    before calibration; external_teacher_acc (round 2) the mean of the feedback copies delivered to it; each a
    mean over the clients. Fails if a teacher is measured after calibration (its argmax is then always the
    label), on other models than those sent (e.g. after training), or over other top_k or weights."""
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params), part, mnist)
    T, top_k, batch = params.pdfl.T, params.pdfl.top_k, params.train.eval_batch_size
    scratch = copy.deepcopy(trainer.clients[0].model)

    def soft(state, x):  # softmax(M(x) / T) of a model as it travelled, eval mode, the evaluation's batches
        scratch.load_state_dict(state)
        scratch.eval()
        with torch.no_grad():
            return torch.cat([torch.softmax(scratch(x[s:s + batch]) / T, dim=1) for s in range(0, len(x), batch)])

    def acc(probs, y):
        return (probs.argmax(dim=1) == y).double().mean().item()

    trainer.start()
    sent = {1: [model_state(c.model) for c in trainer.clients]}  # round r's neighbours send their round-start model
    trainer.run_round(1)
    sent[2] = [model_state(c.model) for c in trainer.clients]
    feedback = {j: dict(by) for j, by in trainer.server.feedback.items()}  # delivered in round 2
    trainer.run_round(2)
    summary = trainer.finish()
    extras = _query("SELECT round, name, value FROM round_metrics WHERE run_id = ? ORDER BY ALL", summary["run_id"])
    by_round = {r: {n: v for rr, n, v in extras if rr == r} for r in (1, 2)}
    assert "external_teacher_acc" not in by_round[1]  # no feedback before round 2
    for r in (1, 2):
        student, internal, external = [], [], []
        for i, c in enumerate(trainer.clients):
            x, y = c.x_train, c.y_train
            student.append(acc(soft(sent[r][i], x), y))
            J = [j for j in range(3) if j != i]  # the complete graph
            w = torch.tensor([by_round[r][f"attn:{i}<-{j}"] for j in J], dtype=torch.float32)
            chosen = sorted(range(len(J)), key=lambda a: (-float(w[a]), a))[:top_k]  # ties to the lower id
            ws = w[chosen] / w[chosen].sum()
            internal.append(acc(sum(wa * soft(sent[r][J[a]], x) for wa, a in zip(ws, chosen)), y))
            if r == 2:
                copies = [state for _, state in sorted(feedback[i].items())]
                external.append(acc(sum(soft(state, x) for state in copies) / len(copies), y))
        # (each client's share is a float32 mean in the code: 1e-6; one sample moves it by 1 / n_k)
        assert by_round[r]["student_acc"] == pytest.approx(sum(student) / 3, rel=1e-6)
        assert by_round[r]["internal_teacher_acc"] == pytest.approx(sum(internal) / 3, rel=1e-6)
        if r == 2:
            assert by_round[r]["external_teacher_acc"] == pytest.approx(sum(external) / 3, rel=1e-6)
    assert min(by_round[r]["internal_teacher_acc"] for r in (1, 2)) < 1  # a calibrated teacher would read 1
    for r in (1, 2):
        attn = {n: v for rr, n, v in extras if rr == r and n.startswith("attn:")}
        assert set(attn) == {f"attn:{i}<-{j}" for i in range(3) for j in range(3) if i != j}
        for i in range(3):
            assert sum(v for n, v in attn.items() if n.startswith(f"attn:{i}<-")) == pytest.approx(1.0)
        best = [max(v for n, v in attn.items() if n.startswith(f"attn:{i}<-")) for i in range(3)]
        assert dict((n, v) for rr, n, v in extras if rr == r)["attention_max"] == pytest.approx(sum(best) / 3)
    # the last round's metrics are the weights the clients used
    last = {n: v for rr, n, v in extras if rr == 2}
    for i, (nbrs, w) in trainer.server.last_weights.items():
        assert [last[f"attn:{i}<-{j}"] for j in nbrs] == pytest.approx(w)


# the other switches repeat the check (make test)
@pytest.mark.parametrize("switch", unit_tier_first([
    {"attention": False}, {"internal_kd": False}, {"external_kd": False}, {"order": "body_then_head"},
    {"internal_kd": False, "external_kd": False, "order": "body_then_head"},
]))
def test_switches_run(tiny_workspace, mnist, switch):
    _, params, part = tiny_workspace
    trainer = _trainer(_params(params, rounds=1, **switch), part, mnist)
    heads_before = [c.model.head.weight.detach().clone() for c in trainer.clients]
    summary = trainer.run()
    # each client's own model on its own test split, written out (fails if a switch leaves a client evaluated
    # with another model, e.g. a peer's copy it trained, or on its training samples)
    assert summary["final_acc"] == pytest.approx(
        mean_accuracy_by_hand(trainer.clients, params.train.eval_batch_size), rel=1e-12)
    assert all(not torch.equal(h, c.model.head.weight) for h, c in zip(heads_before, trainer.clients))
    weights = trainer.server.last_weights
    assert sorted(weights) == [0, 1, 2]
    for i, (nbrs, w) in weights.items():
        assert sorted(nbrs) == sorted({0, 1, 2} - {i}) and sum(w) == pytest.approx(1.0)
        if switch.get("attention") is False:
            assert w == pytest.approx([0.5, 0.5])
            assert "attn_wq" not in trainer.clients[i].state
        else:
            assert w != pytest.approx([0.5, 0.5], abs=1e-4)  # learned in round 1, not uniform any more


def test_models_start_own_and_state_checkpoints_with_weights_only(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    trainer = _trainer(with_section(_params(params), "train", checkpoint_every=1), part, mnist)  # round 1's is read
    initial = [model_state(c.model) for c in trainer.clients]
    trainer.start()  # round 0: nothing sent, nothing averaged
    for c, s in zip(trainer.clients, initial):
        assert all(torch.equal(s[n], t) for n, t in c.model.state_dict().items())
    assert not torch.equal(initial[0]["stem.0.weight"], initial[1]["stem.0.weight"])  # no common body
    knowledge = trainer.server.knowledge  # what each client published, as it travels (float32: P and n)
    counts = torch.stack([knowledge[k]["counts"] for k in range(len(trainer.clients))])
    soft = torch.stack([knowledge[k]["soft"] for k in range(len(trainer.clients))])
    assert (counts.sum(1) == torch.from_numpy(np.diff(part.train_offsets))).all()
    assert torch.allclose(soft.sum(2)[counts > 0], torch.tensor(1.0))
    assert trainer.ledger.total() == 0
    trainer.run_round(1)
    saved = torch.load(paths.CHECKPOINTS / "pdfl.pt", weights_only=True)
    for c in saved["clients"]:
        assert all(isinstance(v, torch.Tensor) for v in c["state"].values())
        assert c["state"]["attn_wq"].shape == (4, 25, 100)  # heads x ceil(C*C / heads) x C*C, persisted
    assert saved["algorithm"]["feedback"]  # the undelivered feedback travels with the checkpoint


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_resume_is_exact_with_a_time_varying_graph(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    p = with_section(_params(params, rounds=3, topology="subsample", subsample_fraction=0.5), "train", checkpoint_every=1)
    reference = _trainer(p, part, mnist, "reference.pt")
    reference.start()
    reference.run_round(1)
    reference.run_round(2)  # checkpointed: a copy of it is what a process killed now leaves
    shutil.copy(paths.CHECKPOINTS / "reference.pt", paths.CHECKPOINTS / "pdfl.pt")
    feedback_after_2 = set(reference.server.feedback)
    reference.run_round(3)
    resumed = _trainer(p, part, mnist)
    assert resumed.start() == 3
    assert resumed.server.topology.history.keys() == {1, 2}
    assert set(resumed.server.feedback) == feedback_after_2
    resumed.run_round(3)
    for a, b in zip(reference.clients, resumed.clients):
        for (n, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
            assert torch.equal(x, y), n
        assert torch.equal(a.state["attn_wq"], b.state["attn_wq"])
    for k, published in reference.server.knowledge.items():
        assert all(torch.equal(t, resumed.server.knowledge[k][n]) for n, t in published.items())
    assert reference.ledger.state_dict() == resumed.ledger.state_dict()
    assert reference.server.topology.to_json() == resumed.server.topology.to_json()


def test_heterogeneous_models_are_refused():
    """Its declaration (params.py `supports`) refuses heterogeneous runs when params load."""
    with pytest.raises(ConfigError, match="train.hetero_algorithms lists pdfl, which trains copies of its neighbours"):
        parse_params({"train": {"hetero_algorithms": ["pdfl"]}})
