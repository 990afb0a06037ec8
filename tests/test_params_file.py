"""params.yaml survives DVC's own rewriting of it: `dvc exp run -S` (presets, sweeps) edits the file in
place with a comment-keeping YAML writer, and a run applied to the workspace leaves its values there
for the next one. A comment after a list value broke the file when a later run emptied that list."""

import pytest
import yaml
from dvc.utils.serialize import modify_yaml

from conftest import REPO_ROOT
from pipeline.experiments import presets
from pipeline.config import load_params


@pytest.mark.slow  # every preset applied in turn, forwards and backwards: the end-to-end tier
def test_presets_applied_one_after_another_leave_a_valid_params_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text((REPO_ROOT / "params.yaml").read_text())
    names = sorted(p.stem for p in (REPO_ROOT / "presets").glob("*.yaml"))
    assert {"table5_scaled", "table6_scaled"} <= set(names)
    for name in names + names[::-1]:  # each preset on top of whatever the one before left
        flat = presets.check(name, REPO_ROOT / "params.yaml", REPO_ROOT / "presets")
        with modify_yaml(str(path)) as doc:
            for dotted, value in flat.items():
                *parents, key = dotted.split(".")
                node = doc
                for part in parents:
                    node = node[part]
                node[key] = value
        yaml.safe_load(path.read_text())  # still YAML
        load_params(path)  # and still valid params
