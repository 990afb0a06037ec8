"""Every default the README and docs/ state agrees with params.yaml.

A documented default is a code span said to be one: "`section.key: value` (the default)" (several spans
before one "(the defaults"), "`section.key` (value by default" / "(`value`, default", and
"by default (`section.key: value`". Each is compared with params.yaml's value."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import REPO_ROOT

SPAN = r"`([a-z_]+)\.([A-Za-z_]+): ([^`]+)`"
STATED = [
    re.compile(rf"((?:{SPAN}(?:, | and )?)+) \(the defaults?[);,]"),  # `a.b: v`, `c.d: w` (the defaults
    re.compile(rf"by default \({SPAN}"),  # Off by default (`devices.enabled: false`)
    re.compile(r"`([a-z_]+)\.([A-Za-z_]+)` \(`?([^,()`]+?)`?(?: by default|, (?:the )?default)"),  # `a.b` (v by default
]


def documented_defaults() -> list[tuple[str, str, str, str]]:
    """(file, section, key, value as written) of every stated default."""
    out = []
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]:
        text = " ".join(path.read_text().split())  # a statement may wrap lines
        for pattern in STATED:
            for m in pattern.finditer(text):
                spans = re.findall(SPAN, m.group(1)) if pattern is STATED[0] else [m.groups()[:3]]
                out += [(path.name, sec, key, value) for sec, key, value in spans]
    return out


def test_the_docs_state_defaults_this_test_reads():
    """Fails if the patterns stop finding the stated defaults (the check below would then pass on nothing)."""
    found = {(sec, key) for _, sec, key, _ in documented_defaults()}
    assert {("devices", "enabled"), ("encode", "dtype"), ("pfedme", "personal_lr"), ("train", "threads")} <= found


@pytest.mark.parametrize("where, section, key, value", documented_defaults())
def test_a_documented_default_is_params_yaml_s(where, section, key, value):
    """Fails if a page states a default (e.g. `fedcache.consistency: live` (the default)) that params.yaml no
    longer has."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    assert key in params.get(section, {}), f"{where}: {section}.{key} is not a params.yaml key"
    stated, actual = yaml.safe_load(value), params[section][key]
    if isinstance(stated, str) and isinstance(actual, str):
        stated, actual = stated.lower(), actual.lower()
    assert stated == actual, f"{where} says {section}.{key} defaults to {value!r}; params.yaml has {actual!r}"


def test_docs_choices_md_is_what_its_generator_writes_today():
    """docs/choices.md is generated (bench/choices.py docs) from the result files and params.yaml: a value edited
    in params.yaml (say fedcache.beta) or a result file changed without regenerating would leave it stale."""
    import importlib.util
    import sys

    sys.path.insert(0, str(REPO_ROOT / "bench"))  # choices.py imports its sibling `workspace`
    try:
        spec = importlib.util.spec_from_file_location("choices", REPO_ROOT / "bench" / "choices.py")
        choices = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(choices)
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    assert choices.render() == (REPO_ROOT / "docs" / "choices.md").read_text(), \
        "docs/choices.md is stale: run .venv/bin/python bench/choices.py docs"
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    assert f"| `fedcache.beta` | {params['fedcache']['beta']} |" in choices.render()
