"""A run's label: its method's name plus the knobs of that method's own params section that differ
from their defaults, e.g. "pdfl (order=body_then_head)" or "fedcache (T=1.0, consistency=step)", and the schedule
when it is not the default's (issue 24): "fedavg (schedule=deadline)", "fedcache (schedule=async)"; the
bare name when the section is all defaults and the run is a plain sync run without simulated devices
(and for methods without knobs, like local).

Why (issue 22): two runs of one method with different knobs were both called "fedcache" in the
report and the dashboard, so a reader could not tell what ran. The label is written into the runs
table when a run starts and is shown wherever a run is named; `algorithm` stays the bare name for
code that groups or looks up by method.

"Default" is the pydantic field default of the section's model (pipeline/methods/<name>/params.py),
not params.yaml's value, so a label means the same whatever params.yaml says. No pydantic import
here: the training core imports this module (tests/test_torch_only_core.py).
"""

from __future__ import annotations

import json
from typing import Any


def _text(value: Any) -> str:
    """Compact: a string as is, anything else as JSON (1.0, 0.09, true, null, [0.4,0.3,0.3])."""
    if isinstance(value, str):
        return value
    # JSON writes floats as repr does and lists and mappings as params.yaml's flow style would, without spaces
    # (the label separates its knobs with ", ")
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _schedule(params: Any) -> list[str]:
    """The schedule's knob: `schedule=<name>` when train.schedule is not sync, or when the devices are on
    (a sync run on simulated devices has simulated times a plain one lacks, so it is named too)."""
    train, devices = getattr(params, "train", None), getattr(params, "devices", None)
    schedule = getattr(train, "schedule", "sync")
    enabled = bool(getattr(devices, "enabled", False))
    return [f"schedule={schedule}"] if schedule != "sync" or enabled else []


def _noise(params: Any) -> list[str]:
    """The noise on uploads' knobs when it is on (train.dp_noise > 0): a noised run is a variant of its method."""
    train = getattr(params, "train", None)
    sigma = getattr(train, "dp_noise", 0)
    return [f"dp_noise={_text(sigma)}", f"dp_clip={_text(train.dp_clip)}"] if sigma else []


def run_label(params: Any, algorithm: str) -> str:
    """`algorithm` plus the non-default knobs of its section `params.<algorithm>`, in the order the
    section's model declares them, each under its params.yaml name (the alias: `lambda`, not `lambda_`),
    then the schedule (`_schedule`) and the noise on uploads (`_noise`)."""
    section = getattr(params, algorithm)
    # both dumps list the fields in declaration order; model_construct() is the section with its defaults
    # (no type(section) here: tests/test_dvc_params.py hands the code a recording proxy of the params)
    dumped = section.model_dump(mode="json", by_alias=True)
    defaults = section.model_construct().model_dump(mode="json", by_alias=True)
    knobs = [f"{key}={_text(value)}" for key, value in dumped.items() if value != defaults[key]] + _schedule(params) + _noise(params)
    return f"{algorithm} ({', '.join(knobs)})" if knobs else algorithm
