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
    assert flat
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
