"""Which runs are one-key-at-a-time sweeps (`python -m pipeline.experiments.sweeps run NAME`): the swept key,
its value and the sweep, read from the run's DVC experiment name and params."""

from __future__ import annotations

import json
import math

import pandas as pd
import yaml

from pipeline.experiments.dvc import flatten


# ----------------------------------------------------------------------------- ablations (sweeps)

def _same_value(text: str, value) -> bool:
    """Whether the value part of an experiment's name is this param value. pipeline.experiments.sweeps names an
    experiment <sweep>-<last part of key>-<value as a -S flag> (characters a git ref does not take
    replaced by '_'); the flag reads back as YAML."""
    if isinstance(value, (dict, list)):
        return False
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError:
        return False
    if isinstance(parsed, bool) or isinstance(value, bool):
        return parsed is value
    if isinstance(parsed, (int, float)) and isinstance(value, (int, float)):
        return math.isclose(parsed, value, rel_tol=1e-9)
    return parsed == value or text == str(value)


def swept_key(experiment: str | None, params: dict | None, changed: dict | None) -> tuple[str, str] | None:
    """(key, sweep name) of a run of a one-key-at-a-time sweep, None for any other run. The key is the
    param whose name and value end the experiment's name (`ablation_R-R-16`: index.R = 16, sweep
    ablation_R), preferring the keys `changed` lists: a sweep's value that equals params.yaml's (R 16)
    changes nothing. An experiment named otherwise (`dvc exp run -S index.R=4`) counts when it changed
    exactly one key. `seed` is never an ablation: its sweeps are repetitions (Group seeds)."""
    if not isinstance(experiment, str) or not experiment:
        return None
    changed = changed if isinstance(changed, dict) else {}
    found, named = [], False
    for key, value in flatten(params or {}).items():
        if key == "seed":
            continue
        sweep, sep, text = experiment.rpartition(f"-{key.rsplit('.', 1)[-1]}-")
        named = named or bool(sep and sweep)
        if sep and sweep and _same_value(text, value):
            found.append((key, sweep))
    found = [f for f in found if f[0] in changed] or found
    if len(found) == 1:
        return found[0]
    if not named and len(changed) == 1:  # not a sweep's name: a run that changed one plain value
        key, value = next(iter(changed.items()))
        if key != "seed" and not isinstance(value, (list, dict)):
            return key, experiment
    return None


ABLATION_RUN_COLUMNS = ["run_id", "label", "algorithm", "setting", "status", "started_at", "key", "value", "sweep",
                        "context", "also_changed", "seed"]


def ablation_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of one-key-at-a-time sweeps (`python -m pipeline.experiments.sweeps run NAME`, see swept_key): the
    swept key, its value and the sweep, and `context`, the setting and every other param but the seed as
    one text: the runs of one ablation share it (the same configuration but for the swept key), so two
    sweeps of one key with the same `set` join, and sweeps with different `set`s stay apart.
    `also_changed`: the other params the run changed against params.yaml (the sweep's `set`)."""
    rows = []
    if runs.empty or "experiment" not in runs:
        return pd.DataFrame(columns=ABLATION_RUN_COLUMNS)
    for r in runs[runs["experiment"].notna()].itertuples(index=False):
        found = swept_key(r.experiment, r.params, r.changed)
        if found is None:
            continue
        key, sweep = found
        flat = flatten(r.params or {})
        context = json.dumps([r.setting, {k: v for k, v in flat.items() if k not in (key, "seed")}],
                             sort_keys=True, default=str)
        others = {k: v for k, v in (r.changed or {}).items() if k not in (key, "seed")}
        rows.append((r.run_id, r.label, r.algorithm, r.setting, r.status, r.started_at, key, flat.get(key), sweep,
                     context, ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(others.items())),
                     str(flat.get("seed"))))
    out = pd.DataFrame(rows, columns=ABLATION_RUN_COLUMNS)
    out["value"] = pd.Series([row[7] for row in rows], dtype=object)  # as in params: R 16 stays 16, not 16.0
    return out
