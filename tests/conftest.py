"""Shared fixtures for the test suite (each test module may add its own on top)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The project root (where params.yaml lives)."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def _default_params_raw_session() -> dict:
    return yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


@pytest.fixture
def default_params_raw(_default_params_raw_session) -> dict:
    """The repository's params.yaml as a plain dict; a fresh deep copy per test, safe to mutate."""
    return copy.deepcopy(_default_params_raw_session)


@pytest.fixture
def write_params(tmp_path):
    """write_params(raw_or_text, name="params.yaml") -> Path of a params file under a fresh tmp dir.

    A dict (or list) is dumped as YAML; a str is written verbatim (for broken YAML). The file
    lives in tmp_path/"params"/, away from any directory a test uses as its working dir.
    """
    directory = tmp_path / "params"

    def _write(content, name: str = "params.yaml") -> Path:
        directory.mkdir(exist_ok=True)
        path = directory / name
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
        return path

    return _write


@pytest.fixture(scope="session")
def synthetic_labels() -> tuple[np.ndarray, np.ndarray]:
    """(train_y, test_y): 10 classes x 600 train and x 100 test, int64, in a shuffled order."""
    gen = np.random.default_rng(12345)
    train_y = gen.permutation(np.repeat(np.arange(10, dtype=np.int64), 600))
    test_y = gen.permutation(np.repeat(np.arange(10, dtype=np.int64), 100))
    train_y.setflags(write=False)  # session-scoped: no test may change them for the others
    test_y.setflags(write=False)
    return train_y, test_y
