"""A stage started as `python -m flows.<stage>` starts its Prefect server before its own imports (flows/__init__.py,
flows/api.py: start_early); which command lines count as a stage, and that every stage dvc.yaml runs is one of them.
The server's start and its end with the stage: tests/test_stage_processes.py."""

from __future__ import annotations

import re

import pytest
import yaml

import flows
from conftest import REPO_ROOT


@pytest.mark.parametrize("argv, stage", [
    (["/x/.venv/bin/python", "-m", "flows.train", "fedcache", ""], "train"),
    (["python", "-X", "importtime", "-m", "flows.audit", "local", "--hetero", ""], "audit"),
    (["python", "-m", "flows.report", ""], "report"),
    (["python", "-m", "flows.api", "--owner", "1", ""], None),  # the server itself starts none
    (["python", "-m", "flows.pipeline", ""], None),  # the whole-pipeline flow: its stages run in it, not as processes
    (["python", "-m", "flows.trainer", ""], None),
    (["python", "-m", "pipeline.train", ""], None),
    (["python", "-m", "train", ""], None),  # a module of that name outside flows
    (["python", "-m"], None),
    (["python", "script.py", ""], None),
])
def test_a_stage_is_known_from_its_command_line(argv, stage):
    assert flows.stage_of(argv) == stage


def test_every_stage_dvc_runs_is_a_stage():
    """A stage added to dvc.yaml gets its server early too (or this fails until STAGES names it)."""
    dvc = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())
    commands = [(body.get("do") or body)["cmd"] for body in dvc["stages"].values()]
    run = {m.group(1) for cmd in commands for m in [re.search(r"-m flows\.(\w+)", cmd)] if m}
    assert run == set(flows.STAGES)
