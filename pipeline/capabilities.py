"""What a method supports, declared once, in its own params.py (`MethodParams.supports`).

Three axes: the executors that can run it (`train.executor`), the schedules it has a form for
(`train.schedule`), and whether it runs with a different architecture on different clients
(`train.hetero_algorithms`). Each entry is `True` (always), `Never(why)`, or `Only(key, values, why)`:
supported only while the method's own `key` has one of `values` (FedCache's asynchronous form needs
`consistency: round`).

The declaration is read in three places, all through this module: params validation when params load
(pipeline/config.py: before any stage starts, the error naming the key, the method and what it supports),
the training engine (which executor runs the method, and a refusal for params built without validation),
and docs/methods/index.md's support table (`support_table`, checked by tests/test_capabilities.py).

Executors fall back: a method that the asked executor cannot run runs on the sequential one, saying why,
when it can; only a method that can run on neither is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EXECUTORS = ("sequential", "vectorized", "dask")
SCHEDULES = ("sync", "deadline", "quorum", "async")


@dataclass(frozen=True)
class Never:
    why: str


@dataclass(frozen=True)
class Only:
    """Supported only while the method's own params key `key` is one of `values`."""

    key: str
    values: tuple[str, ...]
    why: str


Condition = bool | Never | Only

# a method has an asynchronous form only when it says so: its server half must take one upload at a time
# (`Server.arrive`) and make one client's download from whatever it holds at that instant
ROUNDS_ONLY = Never("its server half is written for rounds (a round's uploads folded together); its asynchronous "
                    "form is not done")


@dataclass(frozen=True)
class Noised:
    """How `train.dp_noise` covers a method's uploads (pipeline/federation/dp_noise.py): every float array of each
    upload to the server is clipped and noised together. `change`: the payload kinds that carry a model, whose change
    from the download of the same kind is what is clipped (DP-FedAvg); `float32`: the method's params keys that must
    be float32 for that (the noise is added to the values as computed, and a model's change is read against its
    download as sent)."""

    change: tuple[str, ...] = ()
    float32: tuple[str, ...] = ("encode_up",)


# a method covered by the noise says so; the others are refused when train.dp_noise > 0
NOT_NOISED = Never("its uploads are not declared to the noise mechanism")


@dataclass(frozen=True)
class Supports:
    """A method's declaration; the entries it leaves out: every executor, every schedule but async (ROUNDS_ONLY),
    heterogeneous runs, and no noise on uploads (NOT_NOISED)."""

    executors: dict[str, Condition] = field(default_factory=dict)
    schedules: dict[str, Condition] = field(default_factory=dict)
    heterogeneous: Condition = True
    noise: Noised | Never = NOT_NOISED

    def __post_init__(self) -> None:
        defaults = {"executors": dict.fromkeys(EXECUTORS, True),
                    "schedules": {**dict.fromkeys(SCHEDULES, True), "async": ROUNDS_ONLY}}
        for axis, known in (("executors", EXECUTORS), ("schedules", SCHEDULES)):
            unknown = set(getattr(self, axis)) - set(known)
            if unknown:
                raise ValueError(f"Supports.{axis} names {sorted(unknown)}; the {axis} are {', '.join(known)}")
            object.__setattr__(self, axis, {**defaults[axis], **getattr(self, axis)})


def _value(section: Any, key: str) -> Any:
    return section.model_dump(by_alias=True)[key]


def holds(condition: Condition, section: Any) -> bool:
    """Whether the condition holds for the method's params section."""
    if isinstance(condition, Only):
        return _value(section, condition.key) in condition.values
    return condition is True


def why_not(condition: Condition, method: str, section: Any) -> str:
    """Why a condition that does not hold does not: its reason, and (Only) the setting that would make it hold."""
    if isinstance(condition, Only):
        return (f"{condition.why}; {method}.{condition.key} = {_value(section, condition.key)!r}: it needs "
                f"{method}.{condition.key}: {' or '.join(condition.values)}")
    return condition.why if isinstance(condition, Never) else "not supported"


def supported(axis: dict[str, Condition], section: Any) -> list[str]:
    return [name for name, condition in axis.items() if holds(condition, section)]


def schedule_refusal(method: str, supports: Supports, section: Any, schedule: str) -> str | None:
    """Why `train.schedule: schedule` cannot run the method (None: it can)."""
    condition = supports.schedules.get(schedule, Never("no form for it"))
    if holds(condition, section):
        return None
    return (f"train.schedule = {schedule!r} cannot run {method}: {why_not(condition, method, section)}. With these "
            f"params {method} runs under train.schedule: {', '.join(supported(supports.schedules, section))}; set "
            f"train.schedule: sync (or another it supports), or leave {method} out of train.algorithms")


def executor_for(method: str, supports: Supports, section: Any, asked: str) -> tuple[str, str | None]:
    """(the executor that runs the method, why it is not the asked one: None when it is). Raises ValueError, naming
    train.executor and what the method supports, when neither the asked executor nor the sequential one can."""
    condition = supports.executors.get(asked, Never("unknown executor"))
    if holds(condition, section):
        return asked, None
    if holds(supports.executors["sequential"], section):
        return "sequential", why_not(condition, method, section)
    raise ValueError(f"train.executor = {asked!r} cannot run {method}: {why_not(condition, method, section)}; nor can "
                     f"the sequential executor: {why_not(supports.executors['sequential'], method, section)}. With "
                     f"these params {method} runs on train.executor: "
                     f"{', '.join(supported(supports.executors, section))}")


def hetero_refusal(method: str, supports: Supports, section: Any) -> str | None:
    """Why the method cannot run with different architectures on different clients (None: it can)."""
    if holds(supports.heterogeneous, section):
        return None
    return (f"train.hetero_algorithms lists {method}, which {why_not(supports.heterogeneous, method, section)}, so it "
            f"needs the same model on every client; remove it from train.hetero_algorithms")


def noise_refusal(method: str, supports: Supports, section: Any, dp_noise: float) -> str | None:
    """Why `train.dp_noise` cannot noise the method's uploads (None: it can, or the noise is off)."""
    if dp_noise == 0:
        return None
    noise = supports.noise
    if isinstance(noise, Never):
        return (f"train.dp_noise = {dp_noise!r} cannot cover {method}: {noise.why}; set train.dp_noise: 0, or leave "
                f"{method} out of train.algorithms (the methods it covers: {', '.join(noised_methods())})")
    for key in noise.float32:
        value = _value(section, key)
        if value != "float32":
            return (f"train.dp_noise = {dp_noise!r} needs {method}.{key}: float32 ({method}.{key} = {value!r}): the "
                    "noise is added where the upload leaves the client, to the values as computed, and an encoding "
                    "has turned them into codes by then; set it to float32, or train.dp_noise: 0")
    return None


def noised_methods() -> list[str]:
    """The methods whose uploads train.dp_noise covers."""
    return [name for name, s in declarations().items() if isinstance(s.noise, Noised)]


def refusals(method: str, supports: Supports, section: Any, executor: str, schedule: str, hetero: bool) -> list[str]:
    """Every reason the method cannot run with these settings (empty: it can)."""
    found = [schedule_refusal(method, supports, section, schedule), hetero_refusal(method, supports, section)
             if hetero else None]
    try:
        executor_for(method, supports, section, executor)
    except ValueError as e:
        found.append(str(e))
    return [f for f in found if f]


# -- the docs' support table ---------------------------------------------------------------------------------

def _cell(condition: Condition, method: str) -> str:
    if condition is True:
        return "yes"
    if isinstance(condition, Only):
        return f"with `{method}.{condition.key}: {' or '.join(condition.values)}`"
    return "no"


def support_table(declarations: dict[str, Supports]) -> str:
    """docs/methods/index.md's table: one row per method, one column per executor, schedule and heterogeneous runs
    (executors other than sequential fall back to it where the method says no)."""
    columns = [*EXECUTORS, *SCHEDULES]
    lines = ["| method | " + " | ".join(f"`{c}`" for c in columns) + " | heterogeneous |",
             "|---" * (len(columns) + 2) + "|"]
    for method, s in declarations.items():
        cells = [_cell(s.executors[e], method) for e in EXECUTORS] + [_cell(s.schedules[x], method) for x in SCHEDULES]
        lines.append(f"| `{method}` | " + " | ".join(cells) + f" | {_cell(s.heterogeneous, method)} |")
    return "\n".join(lines)


def declarations() -> dict[str, Supports]:
    """Every method's declaration, in the catalog's order (each method's params.py; no method code)."""
    from pipeline import method_catalog

    return {name: method_catalog.params_class(name).supports for name in method_catalog.names()}


if __name__ == "__main__":  # docs/methods/index.md's support table: python -m pipeline.capabilities
    # through the imported module: run as __main__, this file's classes are not the ones params.py files use
    from pipeline import capabilities

    print(capabilities.support_table(capabilities.declarations()))
