"""FedAlt: block partition of the multi-exit ResNet-20, block combination, per-block weighted
aggregation, full-model rounds (multiples of tau+1), the seeded capacity profile, two-way and
one-way self-distillation, whole-model uploads and bytes in a real run, acc_global, resume."""

import copy

import duckdb
import pytest
import torch
import torch.nn.functional as F

from models.multiexit import NUM_BLOCKS, MultiExitResNet, block_of, block_state, build_multiexit
from models.resnet import build_model, count_parameters
from pipeline import paths
from pipeline.methods.registry import REGISTRY
from pipeline.methods.fedalt.method import (aggregate, blocks_sent, combine, compute_tier, congested,
                                       distill_weight, fedalt_loss_rows, full_round)
from pipeline.federation.clients import evaluate_model
from pipeline.federation.ledger import nbytes
from pipeline.config import ConfigError, parse_params
from pipeline.methods.fedalt.params import FedAltParams
from pipeline.train.engine import Trainer
from pipeline.federation.losses import kd_rows
from pipeline.results.store import ResultsDB

from conftest import tiny_params_raw, with_section


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests check what is computed and sent, not accuracy."""
    return small_mnist



def _model(seed: int, in_channels: int = 1) -> MultiExitResNet:
    torch.manual_seed(seed)
    model = build_multiexit(in_channels, 10)
    with torch.no_grad():  # make BN buffers differ between seeds too
        for name, t in model.state_dict().items():
            if "running_" in name:
                t.uniform_(0.5, 1.5)
            elif name.endswith("num_batches_tracked"):
                t.fill_(seed)
    return model


def test_every_tensor_belongs_to_exactly_one_block():
    model = _model(0)
    state = model.state_dict()
    parts = [block_state(state, b) for b in range(1, NUM_BLOCKS + 1)]
    assert all(parts)
    assert sum(len(p) for p in parts) == len(state)
    assert set().union(*map(set, parts)) == set(state)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(n for n in state if n in dict(model.named_parameters()))
    assert {block_of(n) for n in names} == {1, 2, 3}
    # each exit belongs to the block it follows; block 3's exit is the ResNet head
    assert all(block_of(n) == 1 for n in names if n.startswith("blocks.0.exit"))
    assert all(block_of(n) == 2 for n in names if n.startswith("blocks.1.exit"))
    assert {n for n in names if n.startswith("blocks.2.exit")} == {"blocks.2.exit.fc.weight", "blocks.2.exit.fc.bias"}
    # the bodies plus the final head are exactly ResNet-20
    exits12 = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("blocks.0.exit", "blocks.1.exit")))
    assert count_parameters(model) - exits12 == count_parameters(build_model("resnet20", 1, 10))
    with pytest.raises(KeyError):
        block_of("head.weight")


def test_exits_have_the_same_shape_and_forward_is_the_final_exit():
    model = _model(0, in_channels=3).eval()
    x = torch.randn(5, 3, 32, 32)
    outs = model.forward_all(x)
    assert len(outs) == NUM_BLOCKS and all(o.shape == (5, 10) for o in outs)
    torch.testing.assert_close(model(x), outs[-1])


@pytest.mark.parametrize("m", [1, 2, 3])
def test_combination_keeps_received_blocks_and_own_later_blocks(m):
    glob, own = _model(1), _model(2)
    g, before = glob.state_dict(), {n: t.clone() for n, t in own.state_dict().items()}
    received = {n: t for b in range(1, m + 1) for n, t in block_state(g, b).items()}
    combine(own, received)
    for n, t in own.state_dict().items():
        expected = g[n] if block_of(n) <= m else before[n]
        assert torch.equal(t, expected), n
    with pytest.raises(ValueError, match="incomplete"):
        combine(own, {"blocks.0.exit.fc.weight": g["blocks.0.exit.fc.weight"]})


def test_per_block_aggregation_is_the_weighted_mean_over_uploaders():
    glob = _model(0).state_dict()
    states = [_model(s).state_dict() for s in (1, 2, 3)]
    weights = [10.0, 30.0, 60.0]
    uploads = [({1: block_state(states[0], 1)}, weights[0]),
               ({b: block_state(states[1], b) for b in (1, 2)}, weights[1]),
               ({b: block_state(states[2], b) for b in (1, 2)}, weights[2])]
    new = aggregate(glob, uploads)
    assert set(new) == set(glob)
    for n, t in new.items():
        b = block_of(n)
        who = {1: [0, 1, 2], 2: [1, 2], 3: []}[b]
        if not who:
            assert torch.equal(t, glob[n]), n  # nobody uploaded block 3
            continue
        total = sum(weights[i] for i in who)
        mean = sum(states[i][n].double() * weights[i] for i in who) / total
        if t.is_floating_point():
            torch.testing.assert_close(t, mean.float(), rtol=1e-6, atol=1e-7)
        else:  # num_batches_tracked
            assert int(t) == round(float(mean))


@pytest.mark.parametrize("tau", [1, 2, 5])
def test_full_model_rounds_are_the_multiples_of_tau_plus_one(tau):
    cfg = FedAltParams(tau=tau, capacity=[1.0, 0.0, 0.0], congestion=0.0)  # every client: 1 block when partial
    full = [r for r in range(1, 31) if all(blocks_sent(cfg, 0, r, k) == NUM_BLOCKS for k in range(8))]
    assert full == list(range(tau + 1, 31, tau + 1))
    assert full == [r for r in range(1, 31) if full_round(tau, r)]
    partial = [r for r in range(1, 31) if r not in full]
    assert all(blocks_sent(cfg, 0, r, k) == 1 for r in partial for k in range(8))


def test_capacity_profile_is_seeded_follows_the_probabilities_and_limits():
    cfg = FedAltParams(capacity=[0.2, 0.0, 0.8], congestion=0.0)
    tiers = [compute_tier(cfg, 0, k) for k in range(2000)]
    assert tiers == [compute_tier(cfg, 0, k) for k in range(2000)]  # same seed, same draws
    assert tiers != [compute_tier(cfg, 1, k) for k in range(2000)]  # another seed, other draws
    assert set(tiers) == {1, 3}  # probability 0: never drawn
    assert 0.17 < tiers.count(1) / 2000 < 0.23
    # one stream per client: a client's tier does not depend on how many clients there are
    assert compute_tier(cfg, 0, 7) == tiers[7]
    # no congestion: fixed per client over (partial) rounds
    assert all(blocks_sent(cfg, 0, r, k) == tiers[k] for r in (1, 2, 4, 5) for k in range(50))
    # congestion always: one block fewer, at least 1
    always = FedAltParams(capacity=[0.2, 0.0, 0.8], congestion=1.0)
    assert all(blocks_sent(always, 0, r, k) == max(1, tiers[k] - 1) for r in (1, 2, 4, 5) for k in range(50))
    # congestion sometimes: varies per round, seeded, and only ever tier or tier - 1 (min 1)
    some = FedAltParams(capacity=[0.0, 0.5, 0.5], congestion=0.3, tau=100)
    draws = [[blocks_sent(some, 0, r, k) for k in range(40)] for r in range(1, 21)]
    assert draws == [[blocks_sent(some, 0, r, k) for k in range(40)] for r in range(1, 21)]
    assert any(len({row[k] for row in draws}) > 1 for k in range(40))  # some client's m changes over rounds
    for k in range(40):
        t = compute_tier(some, 0, k)
        assert {row[k] for row in draws} <= {t, max(1, t - 1)}
    rate = sum(congested(some, 0, r, k) for r in range(1, 101) for k in range(40)) / 4000
    assert 0.27 < rate < 0.33
    # full-model rounds ignore capacity and links
    assert all(blocks_sent(FedAltParams(tau=100, capacity=[1.0, 0.0, 0.0], congestion=1.0), 0, 101, k) == 3
               for k in range(10))


@pytest.mark.parametrize("fedalt,key,words", [
    ({"capacity": [0.5, 0.5]}, "fedalt.capacity", "3 probabilities"),
    ({"capacity": [0.5, 0.7, -0.2]}, "fedalt.capacity", "[0, 1]"),
    ({"capacity": [0.5, 0.3, 0.3]}, "fedalt.capacity", "sum to 1"),
    ({"congestion": 1.5}, "fedalt.congestion", "less than or equal to 1"),
    ({"tau": 0}, "fedalt.tau", "greater than or equal to 1"),
    ({"distill": "both"}, "fedalt.distill", "two_way"),
    ({"distill_warmup": -1}, "fedalt.distill_warmup", "greater than or equal to 0"),
    ({"tiers": [1, 2, 3]}, "fedalt.tiers", "unknown key"),
])
def test_impossible_values_are_config_errors_naming_the_key(fedalt, key, words):
    with pytest.raises(ConfigError) as err:
        parse_params(tiny_params_raw({"fedalt": fedalt}))
    assert key in str(err.value) and words in str(err.value)


def test_distillation_warmup():
    assert [distill_weight(FedAltParams(**{"lambda": 2.0}), r) for r in (1, 5)] == [2.0, 2.0]
    ramp = FedAltParams(**{"lambda": 2.0}, distill_warmup=4)
    assert [distill_weight(ramp, r) for r in (1, 2, 4, 9)] == [0.5, 1.0, 2.0, 2.0]


def test_loss_has_the_self_distillation_term():
    torch.manual_seed(0)
    outs = [torch.randn(6, 10, requires_grad=True) for _ in range(3)]
    y = torch.randint(0, 10, (6,))
    ce = sum(F.cross_entropy(o, y) for o in outs)
    fedalt_loss = lambda *a, **k: fedalt_loss_rows(*a, **k).mean()  # noqa: E731  (the executor's reduction)
    plain = fedalt_loss(outs, y, 0.0, 3.0)
    torch.testing.assert_close(plain, ce)
    lam, T = 0.7, 3.0
    one = fedalt_loss(outs, y, lam, T, two_way=False)
    torch.testing.assert_close(one, ce + lam * sum(kd_rows(o, outs[-1].detach(), T).mean() for o in outs[:-1]))
    two = fedalt_loss(outs, y, lam, T)
    torch.testing.assert_close(two, one + lam * sum(kd_rows(outs[-1], o.detach(), T).mean() for o in outs[:-1]))
    assert float((one - plain).detach()) > 1e-4 and float((two - one).detach()) > 1e-4


@pytest.mark.parametrize("distill", ["two_way", "one_way"])
def test_distillation_alone_trains_the_exits_and_in_two_way_the_final_head(distill):
    """Gradients of the distillation term alone (loss with lambda > 0 minus loss with lambda 0)."""
    model = _model(0)
    torch.manual_seed(1)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    outs = model.forward_all(x)
    two_way = distill == "two_way"
    sd = (fedalt_loss_rows(outs, y, 1.0, 3.0, two_way) - fedalt_loss_rows(outs, y, 0.0, 3.0, two_way)).mean()
    assert float(sd.detach()) > 1e-4
    params = dict(model.named_parameters())
    grads = dict(zip(params, torch.autograd.grad(sd, list(params.values()), allow_unused=True)))
    norm = lambda prefix: sum(float(g.abs().sum()) for n, g in grads.items()  # noqa: E731
                              if n.startswith(prefix) and g is not None)
    assert norm("blocks.0.exit") > 1e-6 and norm("blocks.1.exit") > 1e-6  # the exits learn from the final output
    if two_way:  # ... and the final head (and the last block) from the exits
        assert norm("blocks.2.exit") > 1e-6 and norm("blocks.2.body") > 1e-6
    else:  # the final output is only a (detached) teacher
        assert norm("blocks.2.exit") == 0 and norm("blocks.2.body") == 0


def test_refuses_heterogeneous_models():
    """Its declaration (params.py `supports`) refuses heterogeneous runs when params load."""
    with pytest.raises(ConfigError, match="train.hetero_algorithms lists fedalt, which averages the blocks"):
        parse_params({"train": {"hetero_algorithms": ["fedalt"]}})


def _trainer(params, part, mnist):
    return Trainer(params, REGISTRY["fedalt"], part, mnist, paths.run_dir("fedalt"), paths.checkpoint_path("fedalt"),
                   ResultsDB(paths.RESULTS_DB), [paths.PARTITION])


def _fedalt_params(params, **fedalt):
    return params.model_copy(update={"fedalt": params.fedalt.model_copy(update=fedalt)})


def _weighted_mean_of_clients(trainer) -> dict[str, torch.Tensor]:
    states = [{n: t.detach().cpu() for n, t in c.model.state_dict().items()} for c in trainer.clients]
    w = [float(c.num_train) for c in trainer.clients]
    assert len(set(w)) > 1  # uneven clients: a plain mean would differ
    out = {}
    for n, t in states[0].items():
        mean = sum(s[n].double() * wi for s, wi in zip(states, w)) / sum(w)
        out[n] = mean.to(t.dtype) if t.is_floating_point() else mean.round().to(t.dtype)
    return out


def test_whole_model_uploads_bytes_aggregation_and_acc_global_in_a_real_run(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    # tau 1: round 1 partial (every client 1 or 2 blocks: tiers 1..2, links congested at random), round 2 full
    params = _fedalt_params(params, tau=1, capacity=[0.5, 0.5, 0.0], congestion=0.5)
    trainer = _trainer(params, part, mnist)
    assert all(isinstance(c.model, MultiExitResNet) for c in trainer.clients)
    assert all(c.optimizer.param_groups[0]["params"][0] is next(c.model.parameters()) for c in trainer.clients)
    sent = {(r, k): trainer.server.blocks_sent(r, k) for r in (1, 2) for k in range(3)}
    assert all(sent[1, k] < NUM_BLOCKS for k in range(3)) and all(sent[2, k] == NUM_BLOCKS for k in range(3))
    trainer.start()
    for r in (1, 2):
        trainer.run_round(r)
        # every client uploaded every block, so each block is the sample-weighted mean of all clients' blocks,
        # also blocks 2 and 3 after the partial round, which no (or not every) client received
        glob, mean = trainer.server.global_state, _weighted_mean_of_clients(trainer)
        assert glob.keys() == mean.keys()
        for n, t in glob.items():
            if t.is_floating_point():
                torch.testing.assert_close(t, mean[n], rtol=1e-5, atol=1e-6, msg=f"round {r} {n}")
            else:
                assert torch.equal(t, mean[n]), n
    summary = trainer.finish()
    state = trainer.clients[0].model.state_dict()
    size = {b: sum(nbytes(t) for t in block_state(state, b).values()) for b in (1, 2, 3)}
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ? ORDER BY ALL",
                       [summary["run_id"]]).fetchall()
    extras = dict(((r, n), v) for r, n, v in con.execute(
        "SELECT round, name, value FROM round_metrics WHERE run_id = ?", [summary["run_id"]]).fetchall())
    per_round = con.execute("SELECT round, bytes_up, bytes_down FROM rounds WHERE run_id = ? ORDER BY round",
                            [summary["run_id"]]).fetchall()
    con.close()
    expected = []
    for (r, k), m in sent.items():
        expected += [(r, k, "down", f"block{b}", size[b]) for b in range(1, m + 1)]
        expected += [(r, k, "up", f"block{b}", size[b]) for b in (1, 2, 3)]  # the whole model, whatever it received
        expected.append((r, k, "up", "num_samples", 4))  # its weight in the mean: one int32
    assert sorted(rows) == sorted(expected)
    whole = sum(size.values())
    down1 = sum(size[b] for k in range(3) for b in range(1, sent[1, k] + 1))
    assert per_round == [(0, 0, 0), (1, 3 * (whole + 4), down1), (2, 3 * (whole + 4), 3 * whole)]
    assert summary["bytes_total"] == down1 + 9 * whole + 6 * 4
    assert {n for (_, n) in extras} == {"acc_exit1", "acc_exit2", "acc_exit3", "acc_global", "val_acc"}
    # acc_global: the global model (final exit) on every client's test split, the mean over clients
    model = copy.deepcopy(trainer.clients[0].model)
    model.load_state_dict(trainer.server.global_state)
    accs = [evaluate_model(model, c.x_test, c.y_test, 512)[0] for c in trainer.clients]
    assert extras[2, "acc_global"] == pytest.approx(sum(accs) / 3)
    personal = [evaluate_model(c.model, c.x_test, c.y_test, 512)[0] for c in trainer.clients]
    assert extras[2, "acc_exit3"] == pytest.approx(sum(personal) / 3)


@pytest.mark.slow  # two whole runs compared (a straight one and a resumed one): the end-to-end tier
def test_resume_continues_exactly(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = with_section(_fedalt_params(params, capacity=[0.5, 0.5, 0.0], congestion=0.5, tau=2), "train",
                          checkpoint_every=1)
    straight = _trainer(params, part, mnist)
    straight.run()
    first = _trainer(params, part, mnist)
    first.run_round(first.start())  # round 1, checkpointed
    resumed = _trainer(params, part, mnist)
    assert resumed.start() == 2
    resumed.run_round(2)
    for n, t in straight.server.global_state.items():
        assert torch.equal(t, resumed.server.global_state[n]), n
    for a, b in zip(straight.clients, resumed.clients):
        for (n, t), u in zip(a.model.state_dict().items(), b.model.state_dict().values()):
            assert torch.equal(t, u), n
