"""Gaussian noise on uploads (train.dp_noise, pipeline/federation/dp_noise.py): off by default and then passive; on,
each upload's float arrays (a model's change, not its weights) clipped together to C and noised with sigma * C per
entry, seeded; the same bytes either way; epsilon from opacus's RDP accountant; a method it does not cover refused
when params load."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from boundary import trainer_for
from conftest import tiny_params_raw, with_section
from pipeline.config import ConfigError, parse_params
from pipeline.federation.dp_noise import UploadNoise, epsilon, privatize
from pipeline.federation.ledger import Payload
from pipeline.seeds import torch_generator
from pipeline.train.engine import Simulation


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def noised(params, sigma: float, clip: float):
    return with_section(params, "train", dp_noise=sigma, dp_clip=clip)


# -- the mechanism ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_upload_within_the_bound_gets_noise_of_std_sigma_c(seed):
    x = torch.full((200, 100), 1e-4)  # norm 0.014, well within C = 0.5: not scaled
    ids = torch.arange(200)
    [out] = privatize([Payload("logits", {"sample_ids": ids, "logits": x})], 2.0, 0.5,
                      torch_generator(seed, "test"))
    noise = (out.arrays["logits"] - x).double()
    assert abs(noise.std().item() - 2.0 * 0.5) < 0.02  # 20,000 draws: the std's standard error is 0.005
    assert abs(noise.mean().item()) < 0.03
    assert torch.equal(out.arrays["sample_ids"], ids)  # integer arrays travel in the clear
    assert out.arrays["logits"].dtype == torch.float32 and out.arrays["logits"].shape == x.shape


def test_the_float_arrays_are_clipped_together_before_the_noise():
    """In float64 the mechanism is an equivalence: out = x * C / |x| + sigma * C * (the seeded standard normals),
    |x| over every float array of the upload taken as one vector."""
    a, b = torch.randn(30, 10, dtype=torch.float64) * 5, torch.randn(7, dtype=torch.float64) * 5
    counts = torch.tensor([3, 4], dtype=torch.int64)
    C, sigma = 2.0, 0.3
    out = privatize([Payload("p", {"a": a, "counts": counts}), Payload("q", {"b": b})], sigma, C,
                    torch_generator(0, "test"))
    norm = torch.cat([a.flatten(), b]).norm()
    assert norm > 10 * C
    z = torch.randn(307, generator=torch_generator(0, "test"), dtype=torch.float64)
    torch.testing.assert_close(out[0].arrays["a"], a * C / norm + sigma * C * z[:300].reshape(30, 10), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[1].arrays["b"], b * C / norm + sigma * C * z[300:], rtol=1e-12, atol=1e-12)
    assert torch.equal(out[0].arrays["counts"], counts)
    clipped = privatize([Payload("p", {"a": a})], 0.0, C, torch_generator(0, "test"))[0].arrays["a"]
    assert clipped.norm().item() == pytest.approx(C, rel=1e-12)  # sigma 0: the clip alone, to norm C


def test_a_models_change_not_its_weights_is_clipped():
    base = {"w": torch.randn(50, 20, dtype=torch.float64) * 3, "steps": torch.tensor(7)}
    change = torch.randn(50, 20, dtype=torch.float64) * 0.01  # norm about 0.3, the weights' about 95
    up = [Payload("params", {"w": base["w"] + change, "steps": torch.tensor(9)})]
    down = [Payload("params", base)]
    kept = privatize(up, 0.0, 1.0, torch_generator(0, "t"), ("params",), down)[0].arrays
    torch.testing.assert_close(kept["w"], base["w"] + change, rtol=1e-12, atol=1e-12)  # within C: as it was
    assert kept["steps"].item() == 9  # an integer buffer travels as it is
    cut = privatize(up, 0.0, 0.1, torch_generator(0, "t"), ("params",), down)[0].arrays["w"]
    torch.testing.assert_close(cut - base["w"], change * 0.1 / change.norm(), rtol=1e-9, atol=1e-12)


# -- the accountant --------------------------------------------------------------------------------------------------

def _rdp_epsilon(sigma: float, releases: int, delta: float) -> float:
    """The Gaussian mechanism's RDP written out: multiplier z = sigma / 2 (sensitivity 2C), no subsampling, `releases`
    compositions, converted to (epsilon, delta) as opacus does (Balle et al. 2020, Thm 21) over its orders."""
    from opacus.accountants import RDPAccountant

    z, best = sigma / 2, math.inf
    for a in RDPAccountant.DEFAULT_ALPHAS:
        rdp = releases * a / (2 * z * z)
        best = min(best, rdp - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a))
    return best


@pytest.mark.parametrize("sigma,releases,delta", [(1.0, 7, 1e-5), (4.0, 30, 1e-5), (8.0, 91, 1e-6)])
def test_epsilon_is_the_gaussian_mechanisms_rdp_at_sigma_over_two_without_subsampling(sigma, releases, delta):
    assert epsilon(sigma, releases, delta) == pytest.approx(_rdp_epsilon(sigma, releases, delta), rel=1e-9)


def test_epsilon_grows_with_releases_and_falls_with_sigma():
    assert epsilon(1.0, 0, 1e-5) == 0.0  # nothing sent, nothing spent
    by_rounds = [epsilon(2.0, n, 1e-5) for n in (1, 5, 20, 100)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    by_sigma = [epsilon(s, 10, 1e-5) for s in (0.5, 1, 2, 4, 8)]
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 5


# -- params ----------------------------------------------------------------------------------------------------------

def _load(train: dict, **sections):
    return parse_params(tiny_params_raw({"train": {**tiny_params_raw()["train"], **train}, **sections}))


@pytest.mark.parametrize("method,says", [("pdfl", "relay"), ("fedalt", "blocks"), ("feddkc", "stem features"),
                                         ("fedict", "stem features")])
def test_a_method_the_noise_does_not_cover_is_refused_when_params_load(method, says):
    with pytest.raises(ConfigError) as err:
        _load({"algorithms": [method], "dp_noise": 1.0, "dp_clip": 1.0})
    assert "train.dp_noise" in str(err.value) and method in str(err.value) and says in str(err.value)
    _load({"algorithms": [method]})  # off: it runs


def test_the_noise_needs_a_clip_and_float32_uploads():
    with pytest.raises(ConfigError, match="train.dp_clip"):
        _load({"dp_noise": 1.0})
    with pytest.raises(ConfigError, match="train.dp_clip = 1.0 is read only when train.dp_noise > 0"):
        _load({"dp_clip": 1.0})
    with pytest.raises(ConfigError, match="fedcache.encode_up"):
        _load({"dp_noise": 1.0, "dp_clip": 1.0}, fedcache={"encode_up": "int8"})
    with pytest.raises(ConfigError, match="fedavg.encode_down"):
        _load({"algorithms": ["fedavg"], "dp_noise": 1.0, "dp_clip": 1.0}, fedavg={"encode_down": "float16"})
    for method in ("fedcache", "fd", "fedproto", "fedavg", "mtfl", "pfedme", "local"):
        assert _load({"algorithms": [method], "dp_noise": 0.5, "dp_clip": 2.0}).train.dp_noise == 0.5


# -- in a run --------------------------------------------------------------------------------------------------------

@pytest.mark.slow  # two whole runs compared: the end-to-end tier
def test_off_by_default_nothing_moves_and_on_the_values_move_not_the_bytes(tiny_workspace, mnist, monkeypatch):
    """Off (the default), a run is the run with the mechanism bypassed, bit for bit. On, FedCache's default consistency
    (step) uploads each batch's logits, each a release of its own; the same bytes are counted, the results move."""
    _, params, part = tiny_workspace
    assert params.train.dp_noise == 0
    default = trainer_for(params, part, mnist, "fedcache", "default")
    summary = default.run()
    assert default.sim.noise is None and not any(k.startswith("dp_") for k in summary)
    with monkeypatch.context() as m:
        m.setattr(Simulation, "noised", lambda self, round_, client, upload, download: upload)
        bypassed = trainer_for(params, part, mnist, "fedcache", "bypassed")
        bypassed.run()
    assert default.history == bypassed.history and default.val_history == bypassed.val_history
    assert default.ledger.state_dict() == bypassed.ledger.state_dict()

    on = trainer_for(noised(params, 1.0, 5.0), part, mnist, "fedcache", "on")
    summary = on.run()
    assert on.ledger.state_dict() == default.ledger.state_dict()  # same shapes and dtypes: the same bytes
    assert on.history != default.history
    steps = max(math.ceil(c.num_train / params.train.batch_size) for c in on.clients)
    assert summary["dp_releases"] == steps * params.train.rounds
    assert summary["dp_epsilon"] == pytest.approx(epsilon(1.0, steps * params.train.rounds, 1e-5))
    assert summary["dp_noise"] == 1.0 and summary["dp_clip"] == 5.0 and summary["dp_delta"] == 1e-5

    # killed after round 1 and resumed from its checkpoint: the same noise (seeded by round and client) and releases
    cut = trainer_for(noised(params, 1.0, 5.0), part, mnist, "fedcache", "cut")
    cut.start()
    cut.run_round(1)
    cut.close()
    resumed = trainer_for(noised(params, 1.0, 5.0), part, mnist, "fedcache", "cut")
    assert resumed.run() == {**summary, "run_id": resumed.run_id, "seconds": resumed.summary()["seconds"]}
    assert resumed.run_id == cut.run_id and resumed.history == on.history  # resumed, not started again


def test_a_fedavg_upload_is_the_download_plus_its_clipped_noised_change(tiny_workspace, mnist):
    """The server's copy of a client's model is the global state it sent plus the change clipped to C (and noised):
    with C below the change's norm, |received - sent| is C (the noise tiny here), far from the weights' own norm."""
    _, params, part = tiny_workspace
    trainer = trainer_for(noised(params, 1e-6, 0.05), part, mnist, "fedavg", "avg")
    got, receive = {}, trainer.sim.receive

    def keep(round_, client, upload, at=None):  # what the server receives, by kind
        got[client] = {p.kind: p.arrays for p in upload.payloads}
        return receive(round_, client, upload, at)

    trainer.sim.receive = keep
    trainer.start()
    sent = {n: t.clone() for n, t in trainer.server.global_state.items()}
    trainer.run_round(1)
    for client in trainer.clients:
        up, count = got[client.id]["params"], got[client.id]["num_samples"]
        floats = [n for n, t in sent.items() if t.is_floating_point()]
        change = torch.cat([(up[n].double() - sent[n].double()).flatten() for n in floats])
        mine = torch.cat([(client.model.state_dict()[n].double() - sent[n].double()).flatten() for n in floats])
        assert mine.norm() > 0.5  # the client's own change is well above C: it was cut
        assert change.norm().item() == pytest.approx(0.05, rel=1e-3)
        torch.testing.assert_close(change / change.norm(), mine / mine.norm(), rtol=0, atol=1e-3)  # same direction
        assert torch.equal(count["num_samples"], torch.tensor([client.num_train], dtype=torch.int32))
    assert trainer.sim.noise.summary()["dp_releases"] == 1


def test_the_noise_is_seeded_by_round_and_client():
    noise = UploadNoise(1.0, 1.0, 1e-5, seed=0)
    up = [Payload("logits", {"logits": torch.zeros(4, 10)})]
    first, again, other = noise.apply(3, 1, up), noise.apply(3, 1, up), noise.apply(3, 2, up)
    assert torch.equal(first[0].arrays["logits"], again[0].arrays["logits"])
    assert not torch.equal(first[0].arrays["logits"], other[0].arrays["logits"])
    assert noise.releases == {1: 2, 2: 1}
    assert noise.apply(3, 1, [Payload("n", {"n": np.array([3])})])[0].arrays["n"].tolist() == [3]  # no float: no release
    assert noise.releases == {1: 2, 2: 1}


# -- where users see it ----------------------------------------------------------------------------------------------

def test_a_noised_run_is_labelled_and_its_epsilon_sits_in_the_privacy_table():
    from pipeline.results.labels import run_label
    from pipeline.results.privacy import format_privacy, noise_of, privacy_row

    on = _load({"dp_noise": 1.0, "dp_clip": 5.0})
    assert run_label(on, "fedcache") == "fedcache (dp_noise=1.0, dp_clip=5.0)"
    assert run_label(_load({}), "fedcache") == "fedcache"
    summary = {"dp_noise": 1.0, "dp_clip": 5.0, "dp_delta": 1e-5, "dp_releases": 7, "dp_epsilon": 37.93}
    assert noise_of({"maua": 0.5}) is None and noise_of(summary)["dp_epsilon"] == 37.93
    audit = {"method": "fedcache", "label_mix": {"hows": ["sent by design"]}}
    table = format_privacy([privacy_row("fedcache", audit, summary), privacy_row("fd", audit)])
    head, _, noisy, plain = table.splitlines()
    assert head.endswith("| epsilon |")
    assert noisy.endswith("| 37.9 (delta 1e-05, sigma 1) |") and plain.endswith("| off |")


def test_the_averaging_server_floors_noised_variances_at_zero():
    """Noise can make a BatchNorm running variance negative, and a model loading it computes NaN: the server floors
    them (post-processing of what it received, no privacy cost); other tensors keep their sign."""
    from pipeline.federation.averaging import floor_variances

    state = {"bn.running_var": torch.tensor([-0.5, 2.0]), "bn.running_mean": torch.tensor([-0.5]),
             "conv.weight": torch.tensor([-1.0])}
    floored = floor_variances(state)
    assert floored["bn.running_var"].tolist() == [0.0, 2.0]
    assert floored["bn.running_mean"].tolist() == [-0.5] and floored["conv.weight"].tolist() == [-1.0]


@pytest.mark.parametrize("method", ["fd", "fedproto"])
def test_a_per_class_upload_is_one_release_a_round_with_its_ids_and_counts_in_the_clear(tiny_workspace, mnist, method):
    _, params, part = tiny_workspace
    trainer = trainer_for(with_section(noised(params, 1.0, 2.0), "train", rounds=1), part, mnist, method, method)
    got, receive = {}, trainer.sim.receive

    def keep(round_, client, upload, at=None):
        if round_ == 1:
            got[client] = upload.payloads
        return receive(round_, client, upload, at)

    trainer.sim.receive = keep
    summary = trainer.run()
    assert summary["dp_releases"] == 1 and summary["dp_epsilon"] == pytest.approx(epsilon(1.0, 1, 1e-5))
    for client in trainer.clients:
        [up] = got[client.id]
        held = torch.unique(client.y_train.cpu())
        assert torch.equal(torch.as_tensor(up.arrays["class_ids"]).cpu(), held)  # in the clear
        if method == "fedproto":
            assert torch.equal(up.arrays["counts"].cpu(), torch.bincount(client.y_train.cpu())[held])
