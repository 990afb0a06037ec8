"""Adding a method is a new folder and its params.yaml section (and a docs page): nothing else.

In a copy of the repository, a toy method (logit adjustment by the federation's label prior:
each client uploads its label counts, the server sends back the global counts, and clients
train on CE over logits + tau * log prior) is added as pipeline/methods/toy/ and a `toy:`
section. The conformance suite, the layout checks, the DVC deps and params checks then run there
with the toy in them, and pass.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import copy_worktree

pytestmark = pytest.mark.slow  # a copy of the repository and a pytest run in it

PARAMS_PY = '''
"""The toy method's params.yaml section (`toy:`)."""

from pydantic import Field

from pipeline.config import MethodParams


class ToyParams(MethodParams):
    tau: float = Field(1.0, ge=0, allow_inf_nan=False)
'''

METHOD_PY = '''
"""Toy: logit adjustment by the federation's label prior (bytes: C int64 counts up and down)."""

import torch

from pipeline.federation.contract import LocalUpdate, Server, Upload, Wire
from pipeline.federation.ledger import Payload
from pipeline.federation.losses import ce_rows


class ToyClient(LocalUpdate):
    def begin(self, client, download, round_):
        counts = download[0].arrays["counts"].double() + 1.0 if download else torch.ones(self.num_classes)
        log_prior = (counts / counts.sum()).log().to(torch.get_default_dtype())
        return {"log_prior": log_prior.to(client.y_train.device).expand(len(client.y_train), -1)}

    def loss(self, model, step, phase):
        return ce_rows(model(step.x) + self.params.toy.tau * step.t["log_prior"], step.y)

    def end(self, client, targets, records, round_):
        counts = torch.bincount(client.y_train.cpu(), minlength=self.num_classes)
        return Upload([Payload("counts", {"counts": counts})])


class Toy(Server):
    name = "toy"
    client_cls = ToyClient

    def __init__(self, ctx):
        super().__init__(ctx)
        self.counts = torch.zeros(ctx.num_classes, dtype=torch.int64)

    def wire(self, k):
        counts = Wire(8 * self.ctx.num_classes)
        return {("up", "counts"): counts, ("down", "counts"): counts}

    def configure(self, round_, selected):
        return {k: [Payload("counts", {"counts": self.counts.clone()})] if self.counts.any() else []
                for k in selected}

    def aggregate(self, round_, uploads):
        self.counts = sum(up.payloads[0].arrays["counts"] for up in uploads.values())

    def state_dict(self):
        return {"counts": self.counts.clone()}

    def load_state_dict(self, state):
        self.counts = state["counts"].clone()
'''


def test_a_toy_method_is_a_folder_and_a_params_section(tmp_path):
    repo = copy_worktree(tmp_path / "repo")
    folder = repo / "pipeline/methods/toy"
    folder.mkdir()
    (folder / "__init__.py").write_text('"""The toy method."""\n')
    (folder / "params.py").write_text(textwrap.dedent(PARAMS_PY).lstrip())
    (folder / "method.py").write_text(textwrap.dedent(METHOD_PY).lstrip())
    with (repo / "params.yaml").open("a") as f:
        f.write("\n# toy: logit adjustment by the federation's label prior (docs/methods/toy.md)\ntoy:\n  tau: 1.0\n")
    (repo / "docs/methods/toy.md").write_text("# Toy\n\nLogit adjustment by the federation's label prior.\n")

    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "-k", "toy or layout or every_param", "tests/test_conformance.py", "tests/test_layout.py",
         "tests/test_dvc_deps.py", "tests/test_dvc_params.py", "-rA"],
        cwd=repo, capture_output=True, text=True, timeout=900)
    report = out.stdout + out.stderr
    assert out.returncode == 0, report[-4000:]
    passed = [line for line in report.splitlines() if line.startswith("PASSED") and "toy" in line]
    for check in ("test_vectorized_equals_sequential[toy-homo]", "test_vectorized_equals_sequential[toy-hetero]",
                  "test_a_resumed_run_ends_where_an_uninterrupted_one_does[toy-homo]",
                  "test_every_param_of_a_method_refuses_a_bad_value_naming_the_key[toy]",
                  "test_it_learns_on_tiny_mnist[toy]",
                  "test_a_training_stage_reads_only_its_params[toy]",
                  "test_stage_deps_cover_every_module_its_flow_imports[train-toy]",
                  "test_a_method_folder_holds_a_method_and_its_params[toy]"):
        assert any(check in line for line in passed), f"{check} did not run and pass in the copy:\n" + "\n".join(passed)
