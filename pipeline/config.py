"""Typed params: load params.yaml, validate it, fail early with one clear message.

Every knob of the pipeline lives in params.yaml; this module is its schema. Validation
happens when a stage starts, before any work, so a bad value never leaves half-written
outputs behind. Checks that need the data (R against the smallest class, K against the
number of samples) live in `check_against_data`, called by the stages once the dataset
sizes are known (still before any output is written).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DATASETS = ("fashion_mnist", "mnist", "cifar10")
ENCODERS = ("hog", "simhash", "random_conv", "random_projection", "pixels", "mobilenet_v3_small")


from pipeline.methods.registry import REGISTRY
from pipeline.errors import ConfigError  # noqa: F401  (re-exported: stages import it from here)
from pipeline.data.partition import samples_used


class _Section(BaseModel):
    # forbid: a typo in a key is an error, not a silently ignored knob.
    # strict: a wrong type is an error, not coerced (`num_clients: yes` is not 1 client,
    # `alpha: "1.0"` is not a number); ints are still accepted where a float is expected.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DataParams(_Section):
    dataset: Literal["fashion_mnist", "mnist", "cifar10"] = "fashion_mnist"
    root: str = "data/raw"
    download: bool = False


class PartitionParams(_Section):
    scheme: Literal["dirichlet", "pathological"] = "dirichlet"
    num_clients: int = Field(30, ge=1)
    alpha: float = Field(1.0, gt=0, allow_inf_nan=False)
    classes_per_client: int = Field(2, ge=1)
    samples_per_client: int | None = Field(200, ge=1)
    data_fraction: float | None = Field(None, gt=0, le=1)
    min_samples: int = Field(10, ge=1)
    max_retries: int = Field(100, ge=1)

    @model_validator(mode="after")
    def _one_scale(self) -> "PartitionParams":
        if self.samples_per_client is not None and self.data_fraction is not None:
            raise ValueError(
                f"partition.samples_per_client = {self.samples_per_client!r} and "
                f"partition.data_fraction = {self.data_fraction!r} are both set; "
                "set at most one of them (the other must be null)"
            )
        return self


class EncodeParams(_Section):
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


class IndexParams(_Section):
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


# The methods, as the registry declares them (each method's module says whether it needs one architecture).
ALGORITHMS = tuple(REGISTRY)
AlgorithmName = Literal[ALGORITHMS]  # type: ignore[valid-type]
HOMOGENEOUS_ONLY = tuple(name for name, method in REGISTRY.items() if method.homogeneous_only)


class TrainParams(_Section):
    algorithms: list[AlgorithmName] = list(ALGORITHMS)
    hetero_algorithms: list[AlgorithmName] = []
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
    group_size: int = Field(32, ge=1)
    dask_address: str | None = None  # a running Dask scheduler (tcp://host:8786); None: a local cluster
    dask_workers: int | None = Field(None, ge=1)  # the local cluster's worker processes; None: one per core

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
            raise ValueError(f"must be a list without repeats, drawn from {', '.join(ALGORITHMS)}")
        return v

    @model_validator(mode="after")
    def _something_to_train(self) -> "TrainParams":
        if not self.algorithms and not self.hetero_algorithms:
            raise ValueError("train.algorithms and train.hetero_algorithms are both empty: list at least one "
                             f"method in either, drawn from {', '.join(ALGORITHMS)}")
        return self

    @field_validator("hetero_algorithms")
    @classmethod
    def _hetero(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("must not repeat an algorithm")
        for name in HOMOGENEOUS_ONLY:
            if name in v:
                raise ValueError(f"{name} averages model parameters, so it needs the same model on every client; "
                                 "remove it from the heterogeneous runs")
        return v


class FedCacheParams(_Section):
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    consistency: Literal["live", "round", "step"] = "live"
    cold_start: Literal["skip", "zeros"] = "skip"


class FDParams(_Section):
    gamma: float = Field(1.0, ge=0, allow_inf_nan=False)


class FedAvgParams(_Section):
    eval_model: Literal["personalized", "global"] = "personalized"


class FedProtoParams(_Section):
    lambda_: float = Field(1.0, ge=0, allow_inf_nan=False, alias="lambda")
    eval: Literal["classifier", "prototype"] = "classifier"
    prototype: Literal["mean", "median"] = "mean"
    aggregation: Literal["count", "uniform", "confidence"] = "count"
    align: bool = False
    align_dim: int = Field(64, ge=1)
    compress: bool = False
    topk_fraction: float = Field(0.1, gt=0, le=1)


class PDFLParams(_Section):
    edge_prob: float = Field(0.25, gt=0, le=1)
    min_degree: int = Field(4, ge=1)
    max_redraws: int = Field(100, ge=1)
    topology: Literal["static", "redraw", "subsample"] = "redraw"
    subsample_fraction: float = Field(0.5, gt=0, le=1)
    heads: int = Field(4, ge=1)
    attention: bool = True
    attention_steps: int = Field(20, ge=0)
    attention_lr: float = Field(0.01, gt=0, allow_inf_nan=False)
    attention_samples: int | None = Field(64, ge=1)
    order: Literal["head_then_body", "body_then_head"] = "body_then_head"
    internal_kd: bool = True
    external_kd: bool = True
    external_peers: int = Field(2, ge=1)
    external_steps: int = Field(10, ge=1)
    external_calibrate: bool = False
    kd_weight: float = Field(1.0, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    top_k: int = Field(2, ge=1)


class FedAltParams(_Section):
    tau: int = Field(5, ge=1)
    capacity: list[float] = [0.3, 0.4, 0.3]
    congestion: float = Field(0.2, ge=0, le=1, allow_inf_nan=False)
    lambda_: float = Field(1.0, ge=0, allow_inf_nan=False, alias="lambda")
    T: float = Field(3.0, gt=0, allow_inf_nan=False)
    distill: Literal["two_way", "one_way"] = "two_way"
    distill_warmup: int = Field(0, ge=0)

    @field_validator("capacity")
    @classmethod
    def _capacity(cls, v: list[float]) -> list[float]:
        if len(v) != 3:
            raise ValueError(f"must list 3 probabilities, P(compute tier = 1, 2, 3 blocks) of the multi-exit "
                             f"ResNet-20's 3 blocks; got {len(v)}")
        if any(not (p >= 0 and p <= 1) for p in v):
            raise ValueError("every probability must lie in [0, 1]")
        if abs(sum(v) - 1) > 1e-6:
            raise ValueError(f"the probabilities must sum to 1; they sum to {sum(v):g}")
        return v


class LocalParams(_Section):
    pass


class MTFLParams(_Section):
    pass


class PFedMeParams(_Section):
    eta: float = Field(0.005, gt=0, allow_inf_nan=False)
    lambda_: float = Field(15.0, gt=0, allow_inf_nan=False, alias="lambda")
    beta: float = Field(1.0, gt=0, le=2, allow_inf_nan=False)


class _ServerModelParams(_Section):
    """The server-model knobs FedDKC and FedICT share (pipeline/methods/gkt.py)."""

    server_model: Literal["a4s", "a3"] = "a4s"
    server_epochs: int = Field(1, ge=1)
    server_batch_size: int | None = Field(None, ge=1)


class FedDKCParams(_ServerModelParams):
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(0.12, gt=0, le=1, allow_inf_nan=False)
    temperature: float = Field(3.0, gt=0, allow_inf_nan=False)


class FedICTParams(_ServerModelParams):
    beta: float = Field(1.5, ge=0, allow_inf_nan=False)
    lambda_: float = Field(1.5, ge=0, allow_inf_nan=False, alias="lambda")
    mu: float = Field(1.5, ge=0, allow_inf_nan=False)
    T: float = Field(3.0, gt=0, allow_inf_nan=False)


class ReportParams(_Section):
    baseline: AlgorithmName = "fedavg"
    target_acc: dict[Literal["fashion_mnist", "mnist", "cifar10"], float] = {
        "fashion_mnist": 0.75, "mnist": 0.90, "cifar10": 0.50}

    @field_validator("target_acc")
    @classmethod
    def _in_unit_interval(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: a for k, a in v.items() if not 0 < a <= 1}
        if bad:
            raise ValueError(f"target accuracies must lie in (0, 1]; got {bad}")
        return v


class Params(_Section):
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataParams = DataParams()
    partition: PartitionParams = PartitionParams()
    encode: EncodeParams = EncodeParams()
    index: IndexParams = IndexParams()
    train: TrainParams = TrainParams()
    fedcache: FedCacheParams = FedCacheParams()
    fd: FDParams = FDParams()
    fedavg: FedAvgParams = FedAvgParams()
    fedproto: FedProtoParams = FedProtoParams()
    pdfl: PDFLParams = PDFLParams()
    fedalt: FedAltParams = FedAltParams()
    local: LocalParams = LocalParams()
    mtfl: MTFLParams = MTFLParams()
    pfedme: PFedMeParams = PFedMeParams()
    feddkc: FedDKCParams = FedDKCParams()
    fedict: FedICTParams = FedICTParams()
    report: ReportParams = ReportParams()

    @model_validator(mode="after")
    def _step_needs_lockstep(self) -> "Params":
        if self.fedcache.consistency == "step" and self.train.executor != "vectorized":
            raise ValueError("fedcache.consistency = 'step' makes all clients take each local step together, which "
                             f"only the vectorized executor does; train.executor is {self.train.executor!r}: set "
                             "train.executor: vectorized, or choose fedcache.consistency live or round")
        return self

    @property
    def cache_db_path(self) -> Path:
        return Path(self.index.db_url.removeprefix("sqlite:///"))


def _allowed_keys(loc: tuple) -> list[str] | None:
    """The keys the section holding `loc` accepts (for the unknown-key message)."""
    model: type[BaseModel] = Params
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return None
        model = sub
    return list(model.model_fields)


def _format_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid params in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = _allowed_keys(e["loc"])
            allowed_txt = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {key} = {e['input']!r}: unknown key (check the spelling in params.yaml){allowed_txt}")
            continue
        got = e.get("input")
        got_txt = "" if isinstance(got, dict) else f" = {got!r}"
        lines.append(f"  {key}{got_txt}: {e['msg']}")
    return "\n".join(lines)


def parse_params(raw: dict, source: str = "params") -> Params:
    """Validate a params mapping; raise ConfigError naming every bad key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_error(err, source)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
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


def load_params(path: str | Path = "params.yaml") -> Params:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"params file not found: {path} (run from the project root)")
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return parse_params(raw, str(path))


def check_against_data(params: Params, train_class_sizes: Sequence[int] | None = None,
                       class_sizes: dict[int, int] | None = None) -> None:
    """Checks that need the dataset, called before a stage writes anything.

    `train_class_sizes`: the dataset's training samples per class (the partition stage). K times
    min_samples is checked against the samples the split will use, counted by the same function
    the split uses (`pipeline.data.partition.samples_used`), so this check and the split agree.
    `class_sizes`: the per-label sample counts after partitioning (the index stage: what the
    neighbour search runs over); R must be below the smallest.
    """
    p = params.partition
    if train_class_sizes is not None:
        used = samples_used(train_class_sizes, p)
        if p.num_clients * p.min_samples > used:
            raise ConfigError(
                f"partition.num_clients = {p.num_clients}: with partition.min_samples = {p.min_samples} "
                f"it needs at least {p.num_clients * p.min_samples} training samples, but only "
                f"{used} are used; lower num_clients or min_samples, or use more data"
            )
    if class_sizes is not None:
        smallest_label, smallest = min(class_sizes.items(), key=lambda kv: kv[1])
        if params.index.R >= smallest:
            raise ConfigError(
                f"index.R = {params.index.R}: must be smaller than the smallest class "
                f"(label {smallest_label} has {smallest} samples, so R <= {smallest - 1})"
            )
