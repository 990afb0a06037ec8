"""The audit of a finished run (pipeline/audit/run.py) on the tiny setting: each attack that applies to the method
runs on what training kept, and says so where it does not apply."""

from __future__ import annotations

import json

import pytest

from boundary import trainer_for
from conftest import tiny, with_section
from pipeline import paths
from pipeline.audit.run import audit_run, public_index
from pipeline.results.compare import comparison
from pipeline.results.privacy import format_privacy, privacy_row
from pipeline.results.report import write_outputs
from pipeline.results.store import ResultsDB

SMALL = {"rows": 8, "public": 300, "inverter_epochs": 3, "members": 8, "shadow_models": 2, "shadow_epochs": 1,
         "dlg_clients": 2,
         "dlg_steps": 5}


@pytest.fixture(scope="module")
def mnist(small_mnist):
    return small_mnist


def _audited(tiny_workspace, mnist, method: str) -> dict:
    _, params, part = tiny_workspace
    params = with_section(tiny(params, method), "audit", **SMALL)
    trainer = trainer_for(params, part, mnist, method, method)
    trainer.run()
    return {**audit_run(params, method, part, mnist, paths.RUNS / method), "run_id": trainer.run_id}


def test_fedcache_gives_away_its_labels_and_its_codes_are_inverted(tiny_workspace, mnist):
    result = _audited(tiny_workspace, mnist, "fedcache")
    assert result["label_mix"]["tv"] == 0.0 and result["label_mix"]["hows"] == ["sent by design"]
    rec = result["reconstruction"]
    assert rec["applies"] and rec["encoder"] == "simhash" and rec["psnr"]["n"] == 3
    assert 0 < rec["psnr"]["mean"] < 60 and 0 < rec["baseline_psnr"]["mean"] < 60
    for attack in ("loss", "lira"):
        scores = result["membership"][attack]
        assert scores["n_clients"] == 3 and 0 <= scores["auc"] <= 1
        assert scores["auc_low"] <= scores["auc"] <= scores["auc_high"]
    assert result["summary"].startswith("reconstruction PSNR")
    row = privacy_row("fedcache", result)  # the report's row: every figure with its interval
    assert row["psnr"]["low"] <= row["psnr"]["mean"] <= row["psnr"]["high"] and row["label_tv"]["mean"] == 0.0
    table = format_privacy([row])
    assert table.count("\n") == 2 and f"{row['mia_auc']['mean']:.2f} [" in table and "sent by design" in table
    # the report: beside the run's accuracy and bytes, in comparison.md and metrics.json
    runs = ResultsDB(paths.RUNS / "fedcache" / "run.duckdb").series([result["run_id"]])
    write_outputs(comparison(runs, target=0.5), paths.METRICS, paths.REPORT_DIR, privacy=[row])
    assert table in (paths.REPORT_DIR / "comparison.md").read_text()
    assert json.loads(paths.METRICS.read_text())["fedcache"]["privacy"]["label_tv"]["mean"] == 0.0


@pytest.mark.slow  # trains tiny runs and audits each (the unit tier keeps FedCache's audit above)
def test_fedavg_and_fedalt_are_read_from_their_classifier_updates_and_local_sends_nothing(tiny_workspace, mnist):
    fedavg = _audited(tiny_workspace, mnist, "fedavg")
    assert fedavg["label_mix"]["hows"] == ["from the classifier update"] and fedavg["label_mix"]["n_clients"] == 3
    rec = fedavg["reconstruction"]  # its round-1 update inverted (DLG), each image against its closest training image
    assert rec["applies"] and rec["clients"] == 2 and rec["psnr"]["n"] == 2 and rec["baseline_psnr"]["mean"] > 0
    fedalt = _audited(tiny_workspace, mnist, "fedalt")  # read against its blocks over its initial multi-exit model
    assert fedalt["label_mix"]["hows"] == ["from the classifier update"] and fedalt["label_mix"]["n_clients"] == 3
    local = _audited(tiny_workspace, mnist, "local")
    assert local["label_mix"]["tv"] is None and local["label_mix"]["hows"] == ["nothing uploaded"]
    assert local["membership"]["loss"]["n_clients"] == 3  # a final model exists whatever the method sent


def test_the_public_samples_are_used_by_no_client_and_no_split(tiny_workspace, mnist):
    _, params, part = tiny_workspace
    public = public_index(part, len(mnist.train_y), 10_000, params.seed)
    assert len(public) == len(mnist.train_y) - len(part.train_index) - len(part.val_index)
    assert not set(public.tolist()) & (set(part.train_index.tolist()) | set(part.val_index.tolist()))
    assert (public_index(part, len(mnist.train_y), 50, params.seed) ==
            public_index(part, len(mnist.train_y), 50, params.seed)).all()


@pytest.mark.parametrize("method, round_", [("fedavg", 2), ("pfedme", 2), ("mtfl", 1), ("fedalt", 1)])
def test_the_update_the_server_inverts_is_the_clients_true_gradient(tiny_workspace, mnist, float64, method, round_):
    """One local step of plain SGD on the whole client (batch = its samples, no momentum, no weight decay; pFedMe:
    one personal step, K = 1): the update read as one gradient must be the gradient of the client's loss (FedAlt's:
    its multi-exit loss) at the model the server knows, for the tensors the server holds (MTFL: the shared ones,
    not the BatchNorm). A sign, a wrong starting model, a wrong step count or a wrong pFedMe coefficient in the
    wiring fails it. In float64: an equivalence, whatever the CPU. Round 2 (the model sent is the average of round
    1, no client's initial model) where the server knows the whole model it sent; round 1 for MTFL's private
    BatchNorm and FedAlt's unsent blocks, which the server knows as they start (the round the audit reads)."""
    import torch

    from pipeline.audit.gradient_inversion import model_gradient
    from pipeline.audit.run import client_loss, prepared_clients, update_as_gradient
    from pipeline.encoding_spec import parse
    from pipeline.methods.mtfl.method import private_names
    from pipeline.train import capture

    _, params, part = tiny_workspace
    params = with_section(params, "train", batch_size=64, momentum=0.0, weight_decay=0.0, rounds=2)
    if method == "pfedme":
        params = with_section(params, "pfedme", K=1)
    trainer_for(params, part, mnist, method, "one-step").run()
    kept = capture.load_uploads(paths.RUNS / "one-step", round_)
    [k, *_] = sorted(kept["uploads"])
    client = prepared_clients(params, method, part, mnist, False)[k]
    assert client.num_train <= 64  # one step
    model, grads = update_as_gradient(params, client, kept, parse("float32"), method)
    held = {n for n, _ in model.named_parameters()} - (private_names(model) if method == "mtfl" else set())
    assert set(grads) == held
    true = model_gradient(model.train(), client.x_train, client.y_train, client_loss(params, method), held)
    for name, g in zip([n for n, _ in model.named_parameters() if n in held], true):
        torch.testing.assert_close(grads[name], g.float(), rtol=1e-5, atol=1e-7, msg=name)


NEW_ATTACKS = {"mtfl": "gradient", "pfedme": "gradient", "fedalt": "gradient", "feddkc": "feature", "fedict": "feature"}


@pytest.mark.slow  # trains a tiny run and audits it (DLG or an inverter a client)
@pytest.mark.parametrize("method", sorted(NEW_ATTACKS))
def test_each_methods_reconstruction_attack_applies_with_intervals(tiny_workspace, mnist, method):
    rec = _audited(tiny_workspace, mnist, method)["reconstruction"]
    assert rec["applies"] and rec["attack"].startswith(NEW_ATTACKS[method]) and rec["clients"] == 2
    for name in ("psnr", "ssim", "baseline_psnr", "baseline_ssim"):
        assert rec[name]["n"] == 2 and rec[name]["low"] <= rec[name]["mean"] <= rec[name]["high"], (name, rec[name])
    assert 0 < rec["psnr"]["mean"] < 60 and 0 < rec["baseline_psnr"]["mean"] < 60


@pytest.mark.slow  # trains tiny runs and audits each (the unit tier keeps FedCache's audit above)
def test_the_results_index_holds_each_audited_runs_figures_and_names_a_damaged_audit(tiny_workspace, mnist):
    from pipeline.errors import ResultsError
    from pipeline.results.privacy import figures
    from pipeline.results.store import rebuild_index

    result = _audited(tiny_workspace, mnist, "local")
    out = paths.RESULTS / "audit" / "local" / "audit.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps({**result, "figures": figures("local", result)}))
    rebuild_index(paths.RESULTS_DB, paths.RUNS)
    with ResultsDB(paths.RESULTS_DB).connect(read_only=True) as con:
        rows = dict(con.execute("SELECT metric, mean FROM privacy WHERE run_id = ?", [result["run_id"]]).fetchall())
    assert rows["mia_auc"] == pytest.approx(result["membership"]["loss"]["auc"], abs=1e-4)
    assert "psnr" not in rows and "label_tv" not in rows  # local: nothing to reconstruct, nothing uploaded
    out.write_text("{not json")
    with pytest.raises(ResultsError, match=r"audit/local/audit\.json is damaged .*dvc repro -f audit@local"):
        rebuild_index(paths.RESULTS_DB, paths.RUNS)


@pytest.mark.slow  # trains tiny runs and audits each (the unit tier keeps FedCache's audit above)
def test_a_heterogeneous_run_is_audited_with_shadows_of_each_architecture(tiny_workspace, mnist):
    """audit-hetero@<method>: clients 0, 1, 2 hold ResNet-8, -16, -20 (HETERO_CYCLE); the model holder's LiRA
    trains shadows of each; a damaged audit of the run names the heterogeneous stage that rewrites it."""
    from pipeline.audit.run import SHADOWS
    from pipeline.errors import ResultsError
    from pipeline.federation.clients import HETERO_CYCLE
    from pipeline.methods.registry import REGISTRY
    from pipeline.results.store import RunResultsDB, rebuild_index
    from pipeline.train.engine import Trainer

    _, params, part = tiny_workspace
    params = with_section(tiny(params, "fedcache"), "audit", **SMALL)
    run = paths.run_dir("fedcache", hetero=True)
    Trainer(params, REGISTRY["fedcache"], part, mnist, run, paths.checkpoint_path("fedcache", hetero=True),
            RunResultsDB(run / "run.duckdb"), [paths.PARTITION], hetero=True).run()
    result = audit_run(params, "fedcache", part, mnist, run, hetero=True)
    assert result["run"] == "fedcache-hetero" and result["reconstruction"]["applies"]
    assert result["membership"]["lira"]["n_clients"] == 3
    kept = sorted(SHADOWS.glob("*.pt"))
    assert len(kept) == len(HETERO_CYCLE) == 3  # one set of shadows an architecture
    out = paths.audit_file("fedcache", hetero=True)
    out.parent.mkdir(parents=True)
    out.write_text("{not json")
    with pytest.raises(ResultsError, match=r"fedcache-hetero/audit\.json is damaged .*repro -f audit-hetero@fedcache`"):
        rebuild_index(paths.RESULTS_DB, paths.RUNS)


@pytest.mark.slow  # trains tiny runs and audits each (the unit tier keeps FedCache's audit above)
def test_the_shadows_are_trained_once_and_shared_by_the_audits_of_one_architecture(tiny_workspace, mnist,
                                                                                   monkeypatch):
    from pipeline.audit import membership
    from pipeline.audit.run import SHADOWS

    trained = []
    train = membership.train_shadow_models
    monkeypatch.setattr(membership, "train_shadow_models", lambda *a, **k: trained.append(1) or train(*a, **k))
    first = _audited(tiny_workspace, mnist, "fd")["membership"]["lira"]
    assert len(trained) == 1 and len(list(SHADOWS.glob("*.pt"))) == 1
    second = _audited(tiny_workspace, mnist, "local")["membership"]["lira"]
    assert len(trained) == 1  # the same architecture, data and recipe: the kept shadows
    fresh = [p.unlink() for p in SHADOWS.glob("*.pt")]
    again = _audited(tiny_workspace, mnist, "local")["membership"]["lira"]
    assert fresh and len(trained) == 2 and again == second  # kept or trained again, the same shadows
    assert first["n_clients"] == second["n_clients"] == 3


def test_a_method_without_a_label_mix_estimator_is_said_not_a_crash(tiny_workspace, mnist):
    """A method added later (a folder and a params section) is audited; its label mix says it has no estimator."""
    from pipeline.audit import run

    _, params, part = tiny_workspace
    out = run._label_mix(params, "toy", part, paths.RUNS / "none", {})
    assert not out["applies"] and "no label-mix estimator for toy" in out["why"]
