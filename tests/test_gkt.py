"""FedDKC and FedICT: features up, a server model A4^S trained on them, its logits down."""

import duckdb
import pytest
import torch
import torch.nn.functional as F

from conftest import with_section
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.methods.feddkc.method import kkr
from pipeline.methods.fedict.method import FedICTClient
from pipeline.federation.gkt import label_distribution
from pipeline.federation.contract import Step
from pipeline.train.engine import Trainer
from pipeline.errors import ConfigError
from pipeline.results.store import RunResultsDB
from test_peers import mean_accuracy_by_hand


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests check what is computed and sent, not accuracy."""
    return small_mnist



def _trainer(name, params, part, mnist, hetero=False):
    return Trainer(params, REGISTRY[name], part, mnist, paths.run_dir(name), paths.checkpoint_path(name),
                   RunResultsDB(paths.run_results(name)), [paths.PARTITION], hetero=hetero)


def _comm_and_accs(name, run_id):
    with duckdb.connect(str(paths.run_results(name)), read_only=True) as con:
        rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ?",
                           [run_id]).fetchall()
        accs = [a for (a,) in con.execute("SELECT mean_acc FROM rounds WHERE run_id = ? ORDER BY round",
                                          [run_id]).fetchall()]
    return rows, accs


def test_kkr_sets_every_peak_to_t_and_keeps_the_ranking():
    probs = F.softmax(torch.randn(64, 10) * 3, dim=1)
    refined = kkr(probs, 0.12)
    torch.testing.assert_close(refined.sum(1), torch.ones(64))
    torch.testing.assert_close(refined.max(1).values, torch.full((64,), 0.12))
    assert torch.equal(refined.argmax(1), probs.argmax(1))
    assert (refined >= 0).all()
    # a direct case of the formula: q = ((C T - 1) p + m - T) / (C m - 1)
    p = torch.tensor([[0.5, 0.3, 0.2]])
    expected = ((3 * 0.6 - 1) * p + 0.5 - 0.6) / (3 * 0.5 - 1)
    torch.testing.assert_close(kkr(p, 0.6), expected)
    # uniform knowledge (no largest entry to map) and a map that would go negative both fall back
    assert torch.allclose(kkr(torch.full((1, 4), 0.25), 0.4), torch.tensor([[0.4, 0.2, 0.2, 0.2]]))
    sharpened = kkr(torch.tensor([[0.4, 0.35, 0.25]]), 0.9)  # the map gives 0.25 -> -0.375
    assert torch.allclose(sharpened, torch.tensor([[0.9, 0.05, 0.05]]))


@pytest.mark.slow  # the default server model, ResNet-56 without its stem: seconds of training
@pytest.mark.parametrize("name", ["feddkc", "fedict"])
def test_features_go_up_and_the_server_models_logits_come_down(name, tiny_workspace, mnist):
    """3 rounds with the default server model (the conformance suite runs the smaller one and checks learning).
    Fails if a payload is counted at another size or in another round, or if a round's figure is not the
    clients' own models on their own test splits in eval mode (round 0 and the last round, written out)."""
    _, params, part = tiny_workspace
    trainer = _trainer(name, with_section(params, "train", rounds=3), part, mnist)
    initial = mean_accuracy_by_hand(trainer.clients, params.train.eval_batch_size)
    summary = trainer.run()
    rows, accs = _comm_and_accs(name, summary["run_id"])
    C, (H, W) = part.num_classes, mnist.train_x.shape[1:3]
    n = {c.id: c.num_train for c in trainer.clients}
    up = {k: n[k] * (16 * H * W * 4 + C * 4 + 8) for k in n}  # features, logits (float32), labels (int64)
    down = {k: n[k] * C * 4 for k in n}  # the server's logits, from round 2 on
    expected = [(r, k, "up", "features", up[k]) for r in (1, 2, 3) for k in n]
    expected += [(r, k, "down", "server_logits", down[k]) for r in (2, 3) for k in n]
    assert sorted(rows) == sorted(expected)
    assert summary["bytes_total"] == 3 * sum(up.values()) + 2 * sum(down.values())
    # round 0 and three rounds, evaluated: the set-up row is the initial models' accuracy and the last row the
    # trained models', each written out here (fails if a round's figure is not the clients' own models on their
    # own test splits)
    assert len(accs) == 4
    assert accs[0] == pytest.approx(initial, rel=1e-12) and accs[-1] == pytest.approx(
        mean_accuracy_by_hand(trainer.clients, params.train.eval_batch_size), rel=1e-12)
    # the knowledge sent back is A4^S's logits for each client's own samples
    assert {k: v.shape for k, v in trainer.server.knowledge.items()} == {k: (n[k], C) for k in n}


@pytest.mark.slow  # a heterogeneous run (ResNet-8/16/20): the end-to-end tier, as in the conformance suite
def test_feddkc_runs_with_heterogeneous_clients(tiny_workspace, mnist):
    """A1, A2 and A3 share the 16-channel stem, so every client uploads the same features per sample whatever its
    depth. Fails if a client's upload or download is not counted, or is counted at another size (e.g. a deeper
    client's features taken after its stages), or if the knowledge sent back is not one row per own sample."""
    _, params, part = tiny_workspace
    params = with_section(params, "train", rounds=2)
    trainer = _trainer("feddkc", params, part, mnist, hetero=True)
    summary = trainer.run()
    assert {type(c.model.stages).__name__ for c in trainer.clients} == {"Sequential"}
    assert len({sum(p.numel() for p in c.model.parameters()) for c in trainer.clients}) == 3  # A1, A2, A3
    C, (H, W) = part.num_classes, mnist.train_x.shape[1:3]
    n = {c.id: c.num_train for c in trainer.clients}
    up = sum(n[k] * (16 * H * W * 4 + C * 4 + 8) for k in n)  # features, logits (float32), labels (int64)
    down = sum(n[k] * C * 4 for k in n)  # the server's logits, in round 2 only
    assert (summary["bytes_up"], summary["bytes_down"], summary["bytes_total"]) == (2 * up, down, 2 * up + down)
    assert {k: v.shape for k, v in trainer.server.knowledge.items()} == {k: (n[k], C) for k in n}


def _official_kl(student, teacher, T):
    """The official codes' KL_Loss (batch mean) for one row at a time, written out: T^2 sum q (log q - log p)."""
    q, log_p = F.softmax(teacher / T, 0), F.log_softmax(student / T, 0)
    return T * T * float((q * (q.log() - log_p)).sum())


def test_fedict_client_term_is_the_official_fpkd(tiny_workspace, mnist):
    """FPKD per row as the official code's FPKD (fpkd_T = 3): the prior-weighted KL, sum_c d_c / 3 * KL_c,
    plus the plain KL the paper writes; 0 for a sample with no teacher."""
    _, params, part = tiny_workspace
    trainer = _trainer("fedict", params, part, mnist)
    client = trainer.clients[0]
    local = FedICTClient(params, part.num_classes)
    targets = local.begin(client, [], 1)
    assert torch.isnan(targets["teacher"]).all()  # first round: no server knowledge yet
    torch.manual_seed(0)
    teacher, student = torch.randn(4, 10, dtype=torch.float64), torch.randn(4, 10, dtype=torch.float64)
    teacher[3] = float("nan")
    prior = label_distribution(client.y_train, 10).double()
    step = Step(x=None, y=None, ids=None, t={"teacher": teacher, "prior": prior.expand(4, -1)},
                exchange=None, record=None)
    assert (params.fedict.T, params.fedict.prior_T, params.fedict.beta) == (3.0, 3.0, 1.5)  # official defaults
    got = local.client_kd_rows(student, step)
    for i in range(3):
        q, log_p = F.softmax(teacher[i] / 3, 0), F.log_softmax(student[i] / 3, 0)
        weighted = 9 * float((prior / 3 * q * (q.log() - log_p)).sum())
        assert float(got[i]) == pytest.approx(weighted + _official_kl(student[i], teacher[i], 3.0), rel=1e-12)
    assert got[3] == 0
    # prior_T: null leaves the plain KL
    plain = FedICTClient(with_section(params, "fedict", prior_T=None), part.num_classes).client_kd_rows(student, step)
    assert float(plain[0]) == pytest.approx(_official_kl(student[0], teacher[0], 3.0), rel=1e-12)


def test_fedict_server_is_the_official_lka_sim(tiny_workspace, mnist):
    """LKA_sim per row: (cos(d_k, d) + 1) * KL, beside beta * CE (the official server's loss_kd + alpha * CE)."""
    _, params, part = tiny_workspace
    method = REGISTRY["fedict"](_trainer("fedict", params, part, mnist).server.ctx)
    assert method.ce_weight == params.fedict.beta == 1.5
    uploads = {0: {"labels": torch.tensor([0, 0, 1, 1])}, 1: {"labels": torch.tensor([0, 0, 0, 0])},
               2: {"labels": torch.tensor([0, 1, 1, 1])}}
    method.begin_aggregate(uploads)
    d = label_distribution(torch.tensor([0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1]), method.ctx.num_classes)
    for k, up in uploads.items():
        assert method.similarity[k] == pytest.approx(float(F.cosine_similarity(
            label_distribution(up["labels"], method.ctx.num_classes), d, dim=0)))
    torch.manual_seed(1)
    out, logits = torch.randn(2, 10, dtype=torch.float64), torch.randn(2, 10, dtype=torch.float64)
    rows = method.server_kd_rows(out, logits, torch.tensor([0, 1]))
    for i, k in enumerate([0, 1]):
        expected = (float(method.similarity[k]) + 1) * _official_kl(out[i], logits[i], 3.0)
        assert float(rows[i]) == pytest.approx(expected, rel=1e-6)
    method.p = with_section(params, "fedict", similarity=False).fedict
    rows = method.server_kd_rows(out, logits, torch.tensor([0, 1]))
    assert float(rows[1]) == pytest.approx(_official_kl(out[1], logits[1], 3.0), rel=1e-12)


def test_feddkc_server_term_is_the_official_dkc_kl(tiny_workspace, mnist):
    """The official DKC_KL_Loss: the client's logits divided by S = 0.05, softmax at T = 3, KKR to 0.12,
    then T^2 KL toward the server model's softened output; CE weighs beta on the server."""
    _, params, part = tiny_workspace
    method = REGISTRY["feddkc"](_trainer("feddkc", params, part, mnist).server.ctx)
    assert method.ce_weight == params.feddkc.beta == 1.5
    torch.manual_seed(2)
    out, logits = torch.randn(3, 10, dtype=torch.float64), torch.randn(3, 10, dtype=torch.float64) * 0.1
    rows = method.server_kd_rows(out, logits, torch.tensor([0, 1, 2]))
    for i in range(3):
        p = F.softmax(logits[i] / 0.05 / 3.0, 0)
        m = float(p.max())
        q = ((10 * 0.12 - 1) * p + m - 0.12) / (10 * m - 1)  # KKR, where it stays non-negative
        if float(q.min()) < 0:
            q = torch.full_like(p, (1 - 0.12) / 9)
            q[p.argmax()] = 0.12
        expected = 9 * float((torch.special.xlogy(q, q) - q * F.log_softmax(out[i] / 3, 0)).sum())
        assert float(rows[i]) == pytest.approx(expected, rel=1e-9)


def test_feddkc_client_loss_is_ce_plus_beta_t2_kl_toward_the_downloaded_server_logits(default_params_raw):
    """The client's per-row loss (GKTClient.begin and loss, FedDKCClient.client_kd_rows) on a hand-made batch of
    logits, in float64: CE(s, y) + beta * temperature^2 * KL(softmax(t / temperature) || softmax(s / temperature)),
    t the server's logits of the sample from the download, beta = 1.5 and temperature = 3 (the official defaults);
    a sample without server logits (NaN: the first round's empty download) is trained on CE alone. Written out
    with `math`. Fails if the client distils at KKR's peak probability feddkc.T (0.12) instead of the KD
    temperature, leaves out beta or the T^2 factor, reverses the KL, or takes the teacher from anywhere but the
    download (or lets a missing one into the loss)."""
    import math
    from types import SimpleNamespace

    from pipeline.config import parse_params
    from pipeline.federation.contract import Phase
    from pipeline.federation.ledger import Payload
    from pipeline.methods.feddkc.method import FedDKCClient

    params = parse_params(default_params_raw)
    p = params.feddkc
    assert (p.beta, p.temperature, p.T) == (1.5, 3.0, 0.12)
    C = 4
    local = FedDKCClient(params, C)
    student = [[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0], [-1.0, 1.0, 0.0, 0.5], [0.3, -0.2, 0.0, 1.1]]
    server = [[1.5, 0.0, 0.2, -0.3], [0.0, 0.0, 2.0, 1.0], [0.3, 0.4, -0.5, 2.5], [-2.0, 4.0, 1.0, 0.0]]
    labels = [0, 2, 3, 1]
    client = SimpleNamespace(num_train=4, y_train=torch.tensor(labels))
    assert torch.isnan(local.begin(client, [], 1)["teacher"]).all()  # nothing downloaded: no teacher
    targets = local.begin(client, [Payload("server_logits", {"logits": torch.tensor(server, dtype=torch.float64)})], 2)
    rows = [3, 0, 2]  # a batch in another order than the client's samples: the targets are gathered per row
    teacher = targets["teacher"][rows]
    teacher[2] = float("nan")  # this row's sample has no server logits
    step = Step(x=torch.tensor([student[i] for i in rows], dtype=torch.float64), y=torch.tensor([labels[i] for i in rows]),
                ids=torch.tensor(rows), t={"teacher": teacher}, exchange=None, record=None)
    got = local.loss(torch.nn.Identity(), step, Phase())  # the model's logits are the batch itself

    def log_softmax(v, T=1.0):
        top = max(a / T for a in v)
        return [a / T - top - math.log(sum(math.exp(b / T - top) for b in v)) for a in v]

    for row, i in enumerate(rows):
        ce = -log_softmax(student[i])[labels[i]]
        if row == 2:
            expected = ce
        else:
            log_q, log_p = log_softmax(server[i], 3.0), log_softmax(student[i], 3.0)
            kl = sum(math.exp(a) * (a - b) for a, b in zip(log_q, log_p))
            expected = ce + 1.5 * 3.0 ** 2 * kl
        assert float(got[row]) == pytest.approx(expected, rel=1e-12, abs=0), row


def test_feddkc_refuses_a_peak_below_uniform(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = with_section(params, "feddkc", T=0.1)
    with pytest.raises(ConfigError, match=r"feddkc.T = 0.1.*1/C"):
        _trainer("feddkc", params, part, mnist)
