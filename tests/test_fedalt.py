"""FedAlt: block partition of the multi-exit ResNet-20, block combination, per-block weighted
aggregation, tiers and full-model rounds, the self-distillation loss, bytes in a real run, resume."""

from types import SimpleNamespace

import duckdb
import pytest
import torch
import torch.nn.functional as F

from models.multiexit import NUM_BLOCKS, MultiExitResNet, block_of, block_state, build_multiexit
from models.resnet import build_model, count_parameters
from pipeline import paths
from pipeline.algorithms import REGISTRY
from pipeline.algorithms.fedalt import FedAlt, aggregate, blocks_sent, combine, fedalt_loss_rows
from pipeline.comm import nbytes
from pipeline.config import ConfigError, FedAltParams
from pipeline.engine import Trainer
from pipeline.losses import kd_rows
from pipeline.results import ResultsDB


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


def test_tiers_and_full_model_rounds():
    cfg = FedAltParams(tiers=[1, 2, 3], tau=3)
    for r in (1, 2, 4, 5):
        assert [blocks_sent(cfg, 0, r, k) for k in range(6)] == [1, 2, 3, 1, 2, 3]
    for r in (3, 6, 9):
        assert [blocks_sent(cfg, 0, r, k) for k in range(6)] == [3] * 6
    cfg = FedAltParams(tiers=[1, 2], tau=4, vary_tiers=True)
    draws = [[blocks_sent(cfg, 0, r, k) for k in range(20)] for r in (1, 2, 3)]
    assert draws == [[blocks_sent(cfg, 0, r, k) for k in range(20)] for r in (1, 2, 3)]  # seeded
    assert {m for row in draws for m in row} == {1, 2}
    assert draws[0] != draws[1]  # redrawn per round
    assert [blocks_sent(cfg, 0, 4, k) for k in range(20)] == [3] * 20


def test_loss_has_the_self_distillation_term():
    torch.manual_seed(0)
    outs = [torch.randn(6, 10, requires_grad=True) for _ in range(3)]
    y = torch.randint(0, 10, (6,))
    ce = sum(F.cross_entropy(o, y) for o in outs)
    fedalt_loss = lambda *a: fedalt_loss_rows(*a).mean()  # noqa: E731  (the executor's reduction)
    plain = fedalt_loss(outs, y, 0.0, 3.0)
    torch.testing.assert_close(plain, ce)
    lam, T = 0.7, 3.0
    sd = fedalt_loss(outs, y, lam, T)
    torch.testing.assert_close(sd, ce + lam * sum(kd_rows(o, outs[-1].detach(), T).mean() for o in outs[:-1]))
    assert float((sd - plain).detach()) > 1e-4
    # the final output is the teacher: the distillation term sends it no gradient
    g0 = torch.autograd.grad(plain, outs[-1])[0]
    g1 = torch.autograd.grad(fedalt_loss(outs, y, lam, T), outs[-1])[0]
    torch.testing.assert_close(g0, g1)


def test_refuses_heterogeneous_models():
    with pytest.raises(ConfigError, match="same model"):
        FedAlt(SimpleNamespace(hetero=True))


def _trainer(params, part, mnist):
    return Trainer(params, REGISTRY["fedalt"], part, mnist, paths.run_dir("fedalt"), paths.checkpoint_path("fedalt"),
                   ResultsDB(paths.RESULTS_DB), [paths.PARTITION])


def _fedalt_params(params, **fedalt):
    return params.model_copy(update={"fedalt": params.fedalt.model_copy(update=fedalt)})


def test_bytes_equal_block_payloads_in_a_real_run(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = _fedalt_params(params, tiers=[1, 2, 3], tau=2)  # round 1 partial, round 2 full
    trainer = _trainer(params, part, mnist)
    assert all(isinstance(c.model, MultiExitResNet) for c in trainer.ctx.clients)
    assert all(c.optimizer.param_groups[0]["params"][0] is next(c.model.parameters()) for c in trainer.ctx.clients)
    summary = trainer.run()
    state = trainer.ctx.clients[0].model.state_dict()
    size = {b: sum(nbytes(t) for t in block_state(state, b).values()) for b in (1, 2, 3)}
    con = duckdb.connect(str(paths.RESULTS_DB), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes FROM comm WHERE run_id = ? ORDER BY ALL",
                       [summary["run_id"]]).fetchall()
    extras = con.execute("SELECT DISTINCT name FROM round_metrics WHERE run_id = ?", [summary["run_id"]]).fetchall()
    per_round = con.execute("SELECT round, bytes_up, bytes_down FROM rounds WHERE run_id = ? ORDER BY round",
                            [summary["run_id"]]).fetchall()
    con.close()
    expected = []
    for r, tiers in ((1, [1, 2, 3]), (2, [3, 3, 3])):
        for k, m in enumerate(tiers):
            for b in range(1, m + 1):
                expected += [(r, k, d, f"block{b}", size[b]) for d in ("down", "up")]
    assert sorted(rows) == sorted(expected)
    r1 = size[1] + (size[1] + size[2]) + (size[1] + size[2] + size[3])
    assert per_round == [(0, 0, 0), (1, r1, r1), (2, 3 * sum(size.values()), 3 * sum(size.values()))]
    assert summary["bytes_total"] == 2 * r1 + 6 * sum(size.values())
    assert {n for (n,) in extras} == {"acc_exit1", "acc_exit2", "acc_exit3"}
    # after a full-model round every block was averaged over all clients
    glob = trainer.algorithm.global_state
    ups = [c.model.state_dict() for c in trainer.ctx.clients]
    w = [float(c.num_train) for c in trainer.ctx.clients]
    name = "blocks.2.exit.fc.weight"
    mean = sum(u[name].double().cpu() * wi for u, wi in zip(ups, w)) / sum(w)
    torch.testing.assert_close(glob[name], mean.float())


def test_resume_continues_exactly(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    params = _fedalt_params(params, tiers=[1, 2], tau=2, vary_tiers=True)
    straight = _trainer(params, part, mnist)
    straight.run()
    first = _trainer(params, part, mnist)
    first.run_round(first.start())  # round 1, checkpointed
    resumed = _trainer(params, part, mnist)
    assert resumed.start() == 2
    resumed.run_round(2)
    for n, t in straight.algorithm.global_state.items():
        assert torch.equal(t, resumed.algorithm.global_state[n]), n
    for a, b in zip(straight.ctx.clients, resumed.ctx.clients):
        for (n, t), u in zip(a.model.state_dict().items(), b.model.state_dict().values()):
            assert torch.equal(t, u), n
