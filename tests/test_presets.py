"""Presets (presets/*.yaml): each is valid on params.yaml, becomes -S flags that DVC reads back as
the same values, and a bad one is refused naming the file and the key."""

import subprocess
import sys

import pytest
import yaml

from conftest import REPO_ROOT
from pipeline.experiments import presets
from pipeline.config import ConfigError, parse_params

PRESETS = REPO_ROOT / "presets"


@pytest.mark.parametrize("name", presets.available(PRESETS))
def test_every_preset_is_valid_and_its_flags_read_back(name):
    flat = presets.check(name, REPO_ROOT / "params.yaml", PRESETS)
    assert flat or presets.seeds(presets.preset_path(name, PRESETS))  # compare: params.yaml itself, on 3 seeds
    for flag in presets.flags(flat):
        key, value = flag.split("=", 1)
        assert yaml.safe_load(value) == flat[key], flag  # what `dvc exp run -S` will set
    base = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    parsed = parse_params(presets.apply(base, flat, name))
    for key, value in flat.items():
        section, *rest = key.split(".")
        got = getattr(parsed, section)
        for part in rest:
            got = getattr(got, "lambda_" if part == "lambda" else part)
        assert got == value, key


def test_the_paper_preset_is_the_papers_protocol():
    flat = presets.check("fedcache_paper", REPO_ROOT / "params.yaml", PRESETS)
    assert {k: flat[k] for k in ("partition.num_clients", "partition.alpha", "train.model", "train.batch_size",
                                 "train.local_epochs", "train.lr", "train.fresh_optimizer", "index.R",
                                 "fedcache.beta", "fedcache.cold_start")} == {
        "partition.num_clients": 300, "partition.alpha": 1.0, "train.model": "resnet20", "train.batch_size": 8,
        "train.local_epochs": 1, "train.lr": 0.01, "train.fresh_optimizer": True, "index.R": 16,
        "fedcache.beta": 1.5, "fedcache.cold_start": "zeros"}


def test_a_bad_preset_names_the_file_and_the_key(tmp_path):
    (tmp_path / "typo.yaml").write_text("train:\n  round: 5\n")
    (tmp_path / "nosection.yaml").write_text("trian:\n  rounds: 5\n")
    (tmp_path / "badvalue.yaml").write_text("fedcache:\n  beta: -1\n")
    params = REPO_ROOT / "params.yaml"
    with pytest.raises(ConfigError, match=r"typo\.yaml.*\n.*train\.round.*unknown key"):
        presets.check("typo", params, tmp_path)
    with pytest.raises(ConfigError, match=r"nosection\.yaml: trian\.rounds: params\.yaml has no section 'trian'"):
        presets.check("nosection", params, tmp_path)
    with pytest.raises(ConfigError, match=r"badvalue\.yaml.*\n.*fedcache\.beta"):
        presets.check("badvalue", params, tmp_path)
    with pytest.raises(ConfigError, match=r"no preset 'nope'.*presets: badvalue, nosection, typo"):
        presets.check("nope", params, tmp_path)


def test_run_passes_the_flags_then_the_extra_ones_to_dvc_exp_run(tmp_path):
    (tmp_path / "p.yaml").write_text("train:\n  rounds: 5\n  algorithms: [fd, local]\n")
    cmd = presets.dvc_command("p", ["train.rounds=2"], queue=True, params_file=REPO_ROOT / "params.yaml",
                              presets_dir=tmp_path)
    assert cmd[1:] == ["exp", "run", "--queue", "-S", "train.rounds=5", "-S", "train.algorithms=[fd,local]",
                       "-S", "train.rounds=2"]


def test_the_cli_refuses_an_unknown_preset_with_the_list():
    out = subprocess.run([sys.executable, "-m", "pipeline.experiments.presets", "run", "nope"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no preset 'nope'" in out.stderr and "fedcache_paper" in out.stderr


def test_the_stragglers_preset_is_three_schedules_on_three_seeds_one_population_per_seed():
    """Fails if a seed's three schedules do not share one device population, or seed 0's is not ten times apart."""
    from pipeline.federation.devices import population

    planned = presets.plan("stragglers", [], REPO_ROOT / "params.yaml", PRESETS)
    assert [p.name for p in planned] == [f"stragglers-{e}-s{s}" for e in ("sync", "deadline", "async")
                                         for s in (0, 1, 2)]
    schedules = {p.name: (p.settings["train.schedule"], p.settings["train.algorithms"]) for p in planned}
    assert schedules["stragglers-sync-s1"] == ("sync", ["fedcache", "fedavg", "fedproto", "fd"])
    assert schedules["stragglers-deadline-s2"] == ("deadline", ["fedcache", "fedavg", "fedproto", "fd"])
    assert schedules["stragglers-async-s0"] == ("async", ["fedcache"])
    base = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    speeds: dict[int, set] = {}
    for p in planned:
        params = parse_params(presets.apply(base, p.settings, p.name))
        devices = population(params.devices, params.partition.num_clients, params.seed)
        speeds.setdefault(params.seed, set()).add(tuple(d.samples_per_s for d in devices))
    assert all(len(by_seed) == 1 for by_seed in speeds.values())  # one population for a seed's three schedules
    [speed] = speeds[0]
    assert max(speed) / min(speed) == pytest.approx(10, rel=0.02)
    # later -S flags win over the preset's, in every experiment
    again = presets.plan("stragglers", ["train.threads=1"], REPO_ROOT / "params.yaml", PRESETS)
    assert all(p.settings["train.threads"] == 1 for p in again)


def test_a_bad_experiment_in_a_preset_names_the_file_and_the_entry(tmp_path):
    params = REPO_ROOT / "params.yaml"
    (tmp_path / "two.yaml").write_text("experiments:\n  a:\n    train: {rounds: 2}\n  b:\n    train: {schedule: nope}\n")
    with pytest.raises(ConfigError, match=r"two\.yaml.*experiment b.*\n.*train\.schedule"):
        presets.check("two", params, tmp_path)
    (tmp_path / "badname.yaml").write_text("experiments:\n  'a b':\n    train: {rounds: 2}\n")
    with pytest.raises(ConfigError, match=r"badname\.yaml: experiments\.a b: a name of letters"):
        presets.plan("badname", [], params, tmp_path)
    (tmp_path / "empty.yaml").write_text("experiments:\n  a: {}\n")
    with pytest.raises(ConfigError, match=r"empty\.yaml: experiments\.a: expected a mapping"):
        presets.plan("empty", [], params, tmp_path)


def test_the_table_of_a_preset_of_experiments_without_runs_and_a_bad_target():
    run = lambda *a: subprocess.run([sys.executable, "-m", "pipeline.experiments.presets", *a], cwd=REPO_ROOT,  # noqa: E731
                                    capture_output=True, text=True)
    bad = run("table", "stragglers", "--target", "2")
    assert bad.returncode == 2 and "--target 2.0: expected a mean accuracy in (0, 1]" in bad.stderr
    plain = run("table", "fedcache_paper")
    assert plain.returncode == 2 and "no `experiments:` or `seeds:` section" in plain.stderr


def test_the_table_of_a_preset_of_experiments_names_each_run_by_its_schedule(tmp_path, monkeypatch):
    import json

    import numpy as np

    from dashboard import sample_data
    from pipeline.results.store import RunResultsDB

    monkeypatch.chdir(tmp_path)
    planned = presets.plan("stragglers", [], REPO_ROOT / "params.yaml", PRESETS)
    for exp, sim_s, final in (("stragglers-sync-s0", 5.0, 0.70), ("stragglers-async-s0", 1.0, 0.72)):
        folder = tmp_path / "results" / "experiments" / exp / "fedcache"
        run_id = f"fedcache-{exp}"
        label = f"fedcache (consistency=round, schedule={exp.split('-')[1]})"
        sample_data.write_run(RunResultsDB(folder / "run.duckdb"), run_id, "fedcache", "homo", {},
                              np.full(3, 10), sample_data.curve(final, rounds=4), sim_s=sim_s, label=label)
        (folder / "summary.json").write_text(json.dumps({"run_id": run_id}))
    table = presets.published_table(planned, REPO_ROOT / "params.yaml", target=0.65)
    assert "| simulated s | time to 65% | waiting share |" in table
    # 0.70 - 0.6 * 0.5^r reaches 0.65 at round 4 (5 simulated s a round); 0.72 - 0.62 * 0.5^r at round 4 too (1 s)
    assert "| fedcache (consistency=round, schedule=sync) | homo | 4 |" in table and "| 25.0 s | 40.0% |" in table
    assert "| fedcache (consistency=round, schedule=async) | homo | 4 |" in table and "| 5.0 s | 40.0% |" in table


@pytest.mark.parametrize("cli, name", [("pipeline.experiments.presets", "stragglers"),
                                       ("pipeline.experiments.sweeps", "ablation_R")])
def test_both_clis_refuse_jobs_below_one_before_queueing_anything(cli, name):
    done = subprocess.run([sys.executable, "-m", cli, "run", name, "--jobs", "0"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--jobs 0: expected at least 1" in done.stderr
    assert "dvc" not in done.stdout  # no queue command was printed, so none ran


def test_the_compare_preset_is_params_yaml_on_three_seeds():
    """Fails if `seeds:` does not become one experiment per seed with that root seed and nothing else changed."""
    planned = presets.plan("compare", [], REPO_ROOT / "params.yaml", PRESETS)
    assert [p.name for p in planned] == ["compare-s0", "compare-s1", "compare-s2"]
    assert [p.settings for p in planned] == [{"seed": 0}, {"seed": 1}, {"seed": 2}]


def test_seeds_times_experiments_and_a_bad_seed_list(tmp_path):
    params = REPO_ROOT / "params.yaml"
    (tmp_path / "both.yaml").write_text("seeds: [3, 5]\nexperiments:\n  a:\n    train: {rounds: 2}\n"
                                        "  b:\n    train: {rounds: 3}\n")
    planned = presets.plan("both", [], params, tmp_path)
    assert [(p.name, p.settings["seed"], p.settings["train.rounds"]) for p in planned] == [
        ("both-a-s3", 3, 2), ("both-a-s5", 5, 2), ("both-b-s3", 3, 3), ("both-b-s5", 5, 3)]
    for bad in ("[0, 0]", "[-1]", "[]", "zero", "[1.5]"):
        (tmp_path / "bad.yaml").write_text(f"seeds: {bad}\n")
        with pytest.raises(ConfigError, match=r"bad\.yaml: seeds: expected a list of distinct non-negative integers"):
            presets.plan("bad", [], params, tmp_path)


def _published(tmp_path, exp: str, algorithm: str, seed: int, accs) -> None:
    """A published run of `algorithm` in experiment `exp`: every client's accuracy per round from `accs` [K, R]."""
    import json

    from pipeline.results.store import RunResultsDB

    folder = tmp_path / "results" / "experiments" / exp / algorithm
    db, run_id = RunResultsDB(folder / "run.duckdb"), f"{algorithm}-{exp}"
    db.start_run(run_id, algorithm, "fashion_mnist", "homo", {"seed": seed}, "test", label=algorithm)
    for r in range(accs.shape[1]):
        rows = [(k, float(accs[k, r]), 100) for k in range(accs.shape[0])]
        db.write_round(run_id, r + 1, float(accs[:, r].mean()), 10, 10, 0.1, rows, [])
    (folder / "summary.json").write_text(json.dumps({"run_id": run_id}))


def test_the_table_of_a_seeded_preset_reports_over_seeds_with_paired_words(tmp_path, monkeypatch):
    """Fails if runs of three seeds are not pooled per method (t interval over seeds) or their paired difference
    is worded against its interval: fedcache is 2 points ahead of local on every client of every seed."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    (tmp_path / "three.yaml").write_text("seeds: [0, 1, 2]\n")
    planned = presets.plan("three", [], REPO_ROOT / "params.yaml", tmp_path)
    for seed, exp in enumerate(p.name for p in planned):
        base = np.random.default_rng(seed).uniform(0.4, 0.8, (6, 3))
        _published(tmp_path, exp, "local", seed, base)
        _published(tmp_path, exp, "fedcache", seed, base + 0.02)
    table = presets.published_table(planned, REPO_ROOT / "params.yaml", target=0.65)
    assert "| fedcache | homo | 3 |" in table and "3 seeds (t interval over seeds" in table
    assert "| fedcache | local | homo | 3 | +2.00 [+2.00, +2.00] | ahead |" in table
    assert "MAUA: fedcache ahead of local" in table
