"""Typed params: load params.yaml, validate it, fail early with one clear message.

Every knob of the pipeline lives in params.yaml; this module is its schema. The shared sections
(data, partition, encode, index, train, devices, report) are defined here; each method's section is its
own `pipeline/methods/<name>/params.py` (a `MethodParams` subclass), found by pipeline/method_catalog.py.
Nothing here imports torch or method code: `names()` lists the method folders, and a method's
params module is imported only when its section is validated.

A stage validates the sections it reads, before any work, so a bad value never leaves
half-written outputs behind: the data stages the shared sections (`load_params(methods=())`), a
training stage those plus its own method's, everything else (presets, sweeps, tests) every
section. Checks that need the data (K against the number of samples, R against the smallest
class) live beside the code they guard: `pipeline.data.partition.check_clients_fit` and
`pipeline.index.neighbours.check_neighbours_fit`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

DATASETS = ("fashion_mnist", "mnist", "cifar10")
ENCODERS = ("hog", "simhash", "random_conv", "random_projection", "pixels", "mobilenet_v3_small")

from pipeline.errors import ConfigError  # noqa: F401  (re-exported: stages import it from here)
from pipeline import method_catalog  # the methods' names and params classes, without their code
from pipeline.capabilities import Supports, noise_refusal, refusals
from pipeline.encoding_spec import check_columns
from pipeline.encoding_spec import parse as parse_encoding


class Section(BaseModel):
    # forbid: a typo in a key is an error, not a silently ignored knob.
    # strict: a wrong type is an error, not coerced (`num_clients: yes` is not 1 client,
    # `alpha: "1.0"` is not a number); ints are still accepted where a float is expected.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# a params field that names a payload encoding (pipeline/encoding_spec.py): checked, and written canonically, on load
Encoding = Annotated[str, AfterValidator(lambda text: str(parse_encoding(text)))]

# the classes of each dataset (pipeline/data/datasets.py names them; a test checks the counts agree)
NUM_CLASSES = {"fashion_mnist": 10, "mnist": 10, "cifar10": 10}


class DataParams(Section):
    dataset: Literal["fashion_mnist", "mnist", "cifar10"] = "fashion_mnist"
    root: str = "data/raw"
    download: bool = False


class PartitionParams(Section):
    scheme: Literal["dirichlet", "pathological"] = "dirichlet"
    num_clients: int = Field(30, ge=1)
    alpha: float = Field(1.0, gt=0, allow_inf_nan=False)
    classes_per_client: int = Field(2, ge=1)
    samples_per_client: int | None = Field(200, ge=1)
    data_fraction: float | None = Field(None, gt=0, le=1)
    min_samples: int = Field(10, ge=1)
    max_retries: int = Field(100, ge=1)
    # each client's test split: this share of every class's test images, divided over the clients
    test_fraction: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    # each client's validation split: val_ratio x its training count per class, from unused training samples;
    # when the partition uses every sample, val_holdout of each client's own samples instead
    val_ratio: float = Field(1.0, ge=0, le=100, allow_inf_nan=False)
    val_holdout: float = Field(0.1, ge=0, le=0.5, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_scale(self) -> "PartitionParams":
        if self.samples_per_client is not None and self.data_fraction is not None:
            raise ValueError(
                f"partition.samples_per_client = {self.samples_per_client!r} and "
                f"partition.data_fraction = {self.data_fraction!r} are both set; "
                "set at most one of them (the other must be null)"
            )
        return self


class EncodeParams(Section):
    encoder: Literal["hog", "simhash", "random_conv", "random_projection", "pixels", "mobilenet_v3_small"] = "simhash"
    dim: int = Field(256, ge=8, le=4096)
    image_size: int = Field(32, ge=16, le=512)
    weights: str | None = None
    batch_size: int = Field(512, ge=1)
    dtype: Literal["float16", "float32"] = "float16"
    # simhash only: sign bits per sample (stored packed, bits/8 bytes) and the fixed offset
    # subtracted from every unit-norm HOG feature before projecting, in units of 1/sqrt(d)
    bits: int = Field(1024, ge=8, le=65536)
    centre: float = Field(0.5, ge=0, le=8, allow_inf_nan=False)

    @field_validator("bits")
    @classmethod
    def _whole_bytes(cls, bits: int) -> int:
        if bits % 8:
            raise ValueError(f"must be a multiple of 8 (codes are packed 8 sign bits to a byte), e.g. {bits // 8 * 8 or 8}")
        return bits


class IndexParams(Section):
    R: int = Field(16, ge=1)
    same_client: bool = True
    exact_max: int = Field(20000, ge=1)
    hnsw_m: int = Field(32, ge=4, le=256)
    hnsw_ef_construction: int = Field(200, ge=8)
    hnsw_ef_search: int = Field(128, ge=8)
    db_url: str = "sqlite:///data/cache/cache.db"

    @field_validator("db_url")
    @classmethod
    def _sqlite_url(cls, db_url: str) -> str:
        # The DB is the index stage's DVC output (the folder data/cache/): a local file there.
        # A field validator (not a model one) so the error names index.db_url and the value.
        path = db_url.removeprefix("sqlite:///")
        if not db_url.startswith("sqlite:///") or not path.startswith("data/cache/") or ".." in path:
            raise ValueError("must be a SQLite URL of a file under data/cache/, e.g. sqlite:///data/cache/cache.db")
        return db_url


class MethodParams(Section):
    """A method's params.yaml section: subclass it in pipeline/methods/<name>/params.py."""

    # what the method supports (executors, schedules, heterogeneous runs), declared once: checked when params
    # load, read by the engine and tabled in docs/methods/index.md (pipeline/capabilities.py)
    supports: ClassVar[Supports] = Supports()
    # this section's values for the smallest setting the tests run every method on (3 clients of 30
    # samples, tests/test_conformance.py), where a default is made for 30 clients
    tiny_setting: ClassVar[dict[str, Any]] = {}
    # the section's encoding keys (pipeline/encoding_spec.py) whose rows hold one value per class (distillation
    # logits): a top-k must keep fewer values than the dataset has classes, checked when params load. A method whose
    # rows are something else (FedProto's prototypes) checks its own
    class_rows: ClassVar[tuple[str, ...]] = ("encode_up", "encode_down")

    def check(self, params: Any) -> None:
        """Rules that tie this section to the shared ones (params.train, ...): raise ValueError."""


def messages_can_be_dropped(params: Any) -> bool:
    """Can the simulated clock drop a message (a deadline, a quorum, async, a device going offline)? An encoding
    whose sender keeps the receiver's copy (a delta, a change to a kept state) is refused there: a lost message
    would part the two copies."""
    t, d = params.train, params.devices
    return d.enabled and (t.schedule != "sync" or d.online_mean_s is not None)


def _known_method(name: str) -> str:
    if name not in method_catalog.names():
        raise ValueError(f"unknown method {name!r}; the methods are {', '.join(method_catalog.names())} "
                         "(one folder each under pipeline/methods/)")
    return name


MethodName = Annotated[str, AfterValidator(_known_method)]


class TrainParams(Section):
    algorithms: list[MethodName] = Field(default_factory=lambda: list(method_catalog.names()))
    hetero_algorithms: list[MethodName] = []
    rounds: int = Field(30, ge=1)
    eval_every: int = Field(1, ge=1)
    participation: float = Field(1.0, gt=0, le=1)
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0, allow_inf_nan=False)
    fresh_optimizer: bool = False
    model: Literal["resnet8", "resnet16", "resnet20"] = "resnet8"
    eval_batch_size: int = Field(512, ge=1)
    checkpoint_every: int = Field(1, ge=1)
    threads: int | None = Field(None, ge=1)
    executor: Literal["sequential", "vectorized", "dask"] = "vectorized"
    # bfloat16: local training's forward + loss and evaluation under torch.autocast(bfloat16); weights, optimizer
    # state and payloads stay float32 (pipeline/train/precision.py). float32 is the reference; auto: bfloat16 on a
    # CPU with AMX (measured faster, tied on accuracy: docs/choices.md), float32 elsewhere
    precision: Literal["auto", "float32", "bfloat16"] = "auto"
    group_size: int = Field(32, ge=1)
    # vectorized on the CPU: groups side by side in lanes, worker threads of one torch thread each, rather than one
    # after another on every torch thread: in lockstep (FedCache `step`), or, where the groups' architectures differ,
    # each group's round alone (pipeline/train/lanes.py, VectorizedExecutor.lanes)
    side_by_side: bool = True
    dask_address: str | None = None  # a running Dask scheduler (tcp://host:8786); None: a local cluster
    dask_workers: int | None = Field(None, ge=1)  # the local cluster's worker processes; None: one per core
    # when a round ends on the simulated clock (devices.enabled; docs/devices.md): sync waits for every
    # selected client, deadline drops the clients that miss the deadline, quorum closes the round when a quorum of
    # its uploads have arrived; async has no rounds: every client trains whenever its device allows, and a "round"
    # is a fixed span of simulated time (async_eval_s). One module each: pipeline/train/schedules/
    schedule: Literal["sync", "deadline", "quorum", "async"] = "sync"
    deadline_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # deadline: simulated seconds after the round starts
    deadline_quantile: float | None = Field(None, gt=0, le=1)  # deadline: this quantile of the round's client times
    quorum: float | None = Field(None, gt=0, le=1)  # quorum: this share of the round's participants' uploads closes it
    # async (pipeline/train/schedules/async_.py): the simulated seconds between two evaluations; None: the median client's
    # update time (its training plus its declared bytes over its links)
    async_eval_s: float | None = Field(None, gt=0, allow_inf_nan=False)
    # async parameter averaging (FedAsync): an arriving update is mixed in with weight
    # async_alpha * (1 + staleness) ** -async_staleness_exponent; async_buffer: fold every this many arrivals
    async_alpha: float = Field(0.6, gt=0, le=1, allow_inf_nan=False)
    async_staleness_exponent: float = Field(0.5, ge=0, allow_inf_nan=False)
    async_buffer: int = Field(1, ge=1)
    # client-level local DP on uploads (pipeline/federation/dp_noise.py, docs/privacy.md): every upload's float
    # arrays clipped together to L2 norm dp_clip, then N(0, (dp_noise * dp_clip)^2) noise per entry; epsilon at
    # dp_delta from opacus's RDP accountant. dp_noise 0: off
    dp_noise: float = Field(0.0, ge=0, allow_inf_nan=False)
    dp_clip: float | None = Field(None, gt=0, allow_inf_nan=False)
    dp_delta: float = Field(1e-5, gt=0, lt=1, allow_inf_nan=False)

    @model_validator(mode="after")
    def _dp_rules(self) -> "TrainParams":
        if self.dp_noise > 0 and self.dp_clip is None:
            raise ValueError(f"train.dp_noise = {self.dp_noise!r} needs train.dp_clip, the L2 bound C every upload is "
                             "clipped to before the noise (choose it from the uploads' norms on training data, "
                             "docs/privacy.md)")
        if self.dp_noise == 0 and self.dp_clip is not None:
            raise ValueError(f"train.dp_clip = {self.dp_clip!r} is read only when train.dp_noise > 0 (it is 0: the "
                             "uploads are sent as computed): set it to null, or train.dp_noise above 0")
        return self

    @model_validator(mode="after")
    def _one_deadline(self) -> "TrainParams":
        given = [k for k in ("deadline_s", "deadline_quantile") if getattr(self, k) is not None]
        if self.schedule == "deadline" and len(given) != 1:
            raise ValueError("train.schedule = 'deadline' needs exactly one of train.deadline_s (simulated seconds) "
                             "and train.deadline_quantile (a quantile of the round's client times, in (0, 1]); "
                             + ("both are set: set the other one to null" if given else "set one of them"))
        if self.schedule != "deadline" and given:
            raise ValueError(f"train.{given[0]} = {getattr(self, given[0])!r} is read only when train.schedule is "
                             f"deadline (it is {self.schedule!r}): set it to null, or train.schedule: deadline")
        return self

    @model_validator(mode="after")
    def _quorum_rules(self) -> "TrainParams":
        if self.schedule == "quorum" and self.quorum is None:
            raise ValueError("train.schedule = 'quorum' needs train.quorum, the share of the round's participants "
                             "whose uploads close it, in (0, 1] (e.g. 0.8)")
        if self.schedule != "quorum" and self.quorum is not None:
            raise ValueError(f"train.quorum = {self.quorum!r} is read only when train.schedule is quorum (it is "
                             f"{self.schedule!r}): set it to null, or train.schedule: quorum")
        return self

    @model_validator(mode="after")
    def _async_rules(self) -> "TrainParams":
        if self.schedule != "async" and self.async_eval_s is not None:
            raise ValueError(f"train.async_eval_s = {self.async_eval_s!r} is read only when train.schedule is async "
                             f"(it is {self.schedule!r}): set it to null, or train.schedule: async")
        if self.schedule == "async" and self.participation != 1.0:
            raise ValueError(f"train.participation = {self.participation!r} samples clients per round, but "
                             "train.schedule = 'async' has no rounds to sample for: every client trains whenever its "
                             "device allows. Set train.participation: 1.0 (or train.schedule: sync)")
        return self

    @field_validator("dask_address")
    @classmethod
    def _scheduler_address(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(tcp|tls)://[^\s:/]+:\d{1,5}", v):
            raise ValueError(f"must be a Dask scheduler's address like tcp://10.0.0.5:8786 (or null: a local "
                             f"cluster); got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_dask_cluster(self) -> "TrainParams":
        if self.dask_address is not None and self.dask_workers is not None:
            raise ValueError("train.dask_workers sizes the local cluster the dask executor starts, but "
                             "train.dask_address joins a running one (its workers are the ones `dask worker` "
                             "started): set one of them, the other null")
        return self

    @field_validator("algorithms")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"must be a list without repeats, drawn from {', '.join(method_catalog.names())}")
        return v

    @model_validator(mode="after")
    def _something_to_train(self) -> "TrainParams":
        if not self.algorithms and not self.hetero_algorithms:
            raise ValueError("train.algorithms and train.hetero_algorithms are both empty: list at least one "
                             f"method in either, drawn from {', '.join(method_catalog.names())}")
        return self

    @field_validator("hetero_algorithms")
    @classmethod
    def _hetero(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("must not repeat an algorithm")
        return v


class DevicesParams(Section):
    """A device per client and the simulated clock (pipeline/federation/devices.py and clock.py, docs/devices.md)."""

    enabled: bool = False
    # the architecture speeds refer to (a drawn median and a trace's `computation` both): another runs slower by
    # the ratio of the two architectures' computed costs
    reference_model: Literal["resnet8", "resnet16", "resnet20"] = "resnet8"
    samples_per_s: float = Field(100.0, gt=0, allow_inf_nan=False)  # median training samples per second
    samples_per_s_sigma: float = Field(0.7, ge=0, le=5, allow_inf_nan=False)  # log-normal sigma (0: all equal)
    up_mbps: float = Field(5.0, gt=0, allow_inf_nan=False)  # median uplink, Mbit/s
    down_mbps: float = Field(20.0, gt=0, allow_inf_nan=False)  # median downlink, Mbit/s
    bandwidth_sigma: float = Field(1.0, ge=0, le=5, allow_inf_nan=False)  # log-normal sigma of both
    online_mean_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # None: always online
    offline_mean_s: float = Field(600.0, gt=0, allow_inf_nan=False)
    trace: str | None = None  # a FedScale device-capacity file (pickle) or a .csv: replaces the drawn speeds
    # the server's speed, training samples per second of reference_model (its compute: 3 forward passes of FLOPs a
    # sample); None: the server's compute takes no simulated time
    server_samples_per_s: float | None = Field(None, gt=0, allow_inf_nan=False)

    @field_validator("trace")
    @classmethod
    def _trace_path(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be the path of a device-capacity file, or null to draw the devices")
        return v


class ReportParams(Section):
    baseline: MethodName = "fedavg"
    target_acc: dict[Literal["fashion_mnist", "mnist", "cifar10"], float] = {
        "fashion_mnist": 0.75, "mnist": 0.90, "cifar10": 0.50}

    @field_validator("target_acc")
    @classmethod
    def _in_unit_interval(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: a for k, a in v.items() if not 0 < a <= 1}
        if bad:
            raise ValueError(f"target accuracies must lie in (0, 1]; got {bad}")
        return v


class AuditParams(Section):
    """The privacy audit (flows/audit.py): what training keeps for it, and the attacks' budgets."""

    # training keeps, in results/runs/<name>/audit/, the uploads of `clients` clients (chosen by the seed) at the
    # set-up, the first and the last round, each per-sample upload cut to `rows` seeded rows, and their final models
    capture: bool = True
    clients: int = Field(8, ge=1)
    rows: int = Field(64, ge=1)
    # the attacks' budgets (flows/audit.py reads these)
    public: int = Field(1000, ge=0)  # public samples the attacker trains on: unused training samples, seeded
    inverter_epochs: int = Field(30, ge=1)  # code inversion: the inverter's epochs on the public codes
    dlg_clients: int = Field(2, ge=1)  # gradient inversion (FedAvg, MTFL, pFedMe, FedAlt): round-1 updates inverted
    dlg_steps: int = Field(200, ge=1)  # DLG's optimiser (Adam) steps on each
    members: int = Field(64, ge=2)  # membership: members (and as many non-members) a client, seeded
    shadow_models: int = Field(4, ge=0)  # offline LiRA's shadow models an architecture (0: loss threshold only)
    shadow_epochs: int = Field(5, ge=1)  # each shadow's epochs on its half of the public samples

    @field_validator("shadow_models")
    @classmethod
    def _a_spread_needs_two(cls, v: int) -> int:
        if v == 1:
            raise ValueError("offline LiRA fits a spread over the shadow models: set 2 or more, or 0 for the loss "
                             "threshold attack alone")
        return v


class CoreParams(Section):
    """The shared sections, which every stage reads."""

    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataParams = DataParams()
    partition: PartitionParams = PartitionParams()
    encode: EncodeParams = EncodeParams()
    index: IndexParams = IndexParams()
    train: TrainParams = TrainParams()
    devices: DevicesParams = DevicesParams()
    report: ReportParams = ReportParams()
    audit: AuditParams = AuditParams()

    @model_validator(mode="after")
    def _clock_for_deadline(self) -> "CoreParams":
        if self.train.schedule in ("deadline", "quorum") and not self.devices.enabled:
            raise ValueError(f"train.schedule = '{self.train.schedule}' drops the clients that miss the round's close "
                             "on the simulated clock, which needs devices: set devices.enabled: true (or "
                             "train.schedule: sync)")
        if self.train.schedule == "async" and not self.devices.enabled:
            raise ValueError("train.schedule = 'async' lets each client train at its own device's pace on the "
                             "simulated clock, which needs devices: set devices.enabled: true (or train.schedule: sync)")
        return self

    @model_validator(mode="after")
    def _method_rules(self) -> "CoreParams":
        # the sections this stage reads (a method's rules are checked where its section is)
        t = self.train
        for name in method_catalog.names():
            section = getattr(self, name, None)
            if not isinstance(section, MethodParams):
                continue
            for key in section.class_rows:
                value = getattr(section, key, None)
                why = None if value is None else check_columns(parse_encoding(value), NUM_CLASSES[self.data.dataset])
                if why:
                    raise ValueError(f"{name}.{key} = {value!r}: {why} ({self.data.dataset} has "
                                     f"{NUM_CLASSES[self.data.dataset]} classes)")
            if name in t.algorithms or name in t.hetero_algorithms:  # what it supports (pipeline/capabilities.py)
                found = refusals(name, section.supports, section, t.executor, t.schedule,
                                 name in t.hetero_algorithms)
                if found:
                    raise ValueError(found[0])
                noise = noise_refusal(name, section.supports, section, t.dp_noise)
                if noise:
                    raise ValueError(noise)
            section.check(self)
        return self

    @property
    def cache_db_path(self) -> Path:
        return Path(self.index.db_url.removeprefix("sqlite:///"))


def _model_name(methods: tuple[str, ...]) -> str:
    return "Params" if methods == method_catalog.names() else "Params__" + "__".join(methods)


@cache
def params_model(methods: tuple[str, ...]) -> type[CoreParams]:
    """The params schema with these methods' sections (each from its own params.py)."""
    sections: dict[str, Any] = {}
    for name in methods:
        cls = method_catalog.params_class(name)
        sections[name] = (cls, cls())
    return create_model(_model_name(methods), __base__=CoreParams, __module__=__name__, **sections)


if TYPE_CHECKING:
    Params = CoreParams  # type checkers see the shared sections; a method's section is an attribute
else:
    def __getattr__(name: str):
        # `from pipeline.config import Params`: the schema with every method's section. The
        # subsets (`Params__fd`, ...) resolve by name too, so their instances pickle (Dask workers).
        if name == "Params":
            return params_model(method_catalog.names())
        if name.startswith("Params__"):
            return params_model(tuple(m for m in name.removeprefix("Params__").split("__") if m))
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The keys the section holding `loc` accepts (for the unknown-key message)."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return None
        model = sub
    return list(model.model_fields)


def _format_error(err: ValidationError, source: str, model: type[BaseModel]) -> str:
    lines = [f"invalid params in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, e["loc"])
            allowed_txt = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {key} = {e['input']!r}: unknown key (check the spelling in params.yaml){allowed_txt}")
            continue
        got = e.get("input")
        got_txt = "" if isinstance(got, dict) else f" = {got!r}"
        lines.append(f"  {key}{got_txt}: {e['msg']}")
    return "\n".join(lines)


def parse_params(raw: dict, source: str = "params", methods: Iterable[str] | None = None) -> CoreParams:
    """Validate a params mapping; raise ConfigError naming every bad key.

    `methods`: the method sections to validate (None: all). The sections of other methods are
    left out unread, so a stage never loads the code of a method it does not run."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    methods = method_catalog.names() if methods is None else tuple(methods)
    for name in methods:
        if name not in method_catalog.names():
            raise ConfigError(f"{source}: unknown method {name!r}; the methods are {', '.join(method_catalog.names())}")
    skipped = set(method_catalog.names()) - set(methods)
    model = params_model(methods)
    try:
        return model.model_validate({k: v for k, v in raw.items() if k not in skipped})
    except ValidationError as err:
        raise ConfigError(_format_error(err, source, model)) from None


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser: 20x the pure-Python one
    """yaml.safe_load, except that a key written twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(f"key {key!r} is written twice in one section (lines {seen[key] + 1} and "
                                  f"{key_node.start_mark.line + 1}); keep one of them")
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def load_params(path: str | Path = "params.yaml", methods: Iterable[str] | None = None) -> CoreParams:
    """params.yaml, validated: the shared sections and `methods`' own (None: every method's)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params file not found: {path} (run from the project root)")
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return parse_params(raw, str(path), methods)
