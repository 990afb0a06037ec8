"""Runs' params: flattened, compared (what differs between runs) and filtered by a key's values; one run's record."""

from __future__ import annotations

import json
from datetime import datetime

import pandas as pd

from pipeline.experiments.dvc import flatten


# ----------------------------------------------------------------------------- params: diff and filter

MISSING = "(absent)"
RUN_META = ("algorithm", "setting", "dataset", "git_rev")  # run columns compared and filtered along with the params


def run_params(runs: pd.DataFrame, run_id: str) -> dict[str, object]:
    """A run's params flattened to dotted keys, with its run columns as `run.<column>`."""
    return _row_params(runs.loc[runs["run_id"] == run_id].iloc[0])


def _row_params(row) -> dict[str, object]:
    return {**{f"run.{k}": row[k] for k in RUN_META if k in row}, **flatten(row["params"] or {})}


def _every_run_params(runs: pd.DataFrame) -> list[dict[str, object]]:
    """run_params of every run, in order (one pass over the rows, not a lookup per run)."""
    return [_row_params(row) for _, row in runs.iterrows()]


def _as_text(value) -> str:
    """One dtype per column for Arrow, and values compared as they read: JSON text (absent stays a word)."""
    return value if value is MISSING else json.dumps(value, sort_keys=True, default=str)


def params_diff(named: dict[str, dict[str, object]]) -> pd.DataFrame:
    """The keys whose values differ among N flattened params (name -> run_params): one row per key, one
    column per name, absent keys included. No row when all agree."""
    keys = sorted(set().union(*named.values())) if named else []
    rows = []
    for key in keys:
        values = [_as_text(flat.get(key, MISSING)) for flat in named.values()]
        if len(set(values)) > 1:
            rows.append([key, *values])
    return pd.DataFrame(rows, columns=["key", *named])


def varying_params(runs: pd.DataFrame) -> dict[str, list[str]]:
    """Every key (run columns and params, dotted) on which the runs do not all agree -> its values as text,
    sorted: what the sidebar can filter on."""
    flats = _every_run_params(runs)
    keys = sorted(set().union(*flats)) if flats else []
    out = {}
    for key in keys:
        values = {_as_text(f.get(key, MISSING)) for f in flats}
        if len(values) > 1:
            out[key] = sorted(values)
    return out


def with_param(runs: pd.DataFrame, key: str, values: list[str]) -> pd.DataFrame:
    """The runs whose value of `key` (as varying_params writes it) is one of `values`."""
    keep = [_as_text(flat.get(key, MISSING)) in values for flat in _every_run_params(runs)]
    return runs[keep]


# ----------------------------------------------------------------------------- one run's record

# runs.environment's keys (pipeline.machine.run_environment, and the engine's torch threads, device and GPU) as a
# reader names them, in this order; any other key follows under its own name
ENVIRONMENT = {"command": "command", "cwd": "working directory", "python": "Python", "packages": "packages",
               "platform": "platform", "cpu": "CPU", "device": "torch device", "gpu": "GPU",
               "torch_threads": "torch threads"}
NOT_RECORDED = "not recorded"


def _packages(versions: dict) -> str:
    """'torch 2.5.1, numpy 2.1.3 (not installed: faiss-cpu)'."""
    have = ", ".join(f"{name} {v}" for name, v in versions.items() if v)
    missing = [name for name, v in versions.items() if not v]
    return (have or "—") + (f" (not installed: {', '.join(missing)})" if missing else "")


def _text(value) -> str:
    if value is None or value == "" or (not isinstance(value, (dict, list, tuple, str)) and pd.isna(value)):
        return "—"
    if isinstance(value, (pd.Timestamp, datetime)):
        return f"{pd.Timestamp(value):%Y-%m-%d %H:%M:%S}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def run_record(row, summary: dict | None = None) -> pd.DataFrame:
    """What the results hold about one run (a row of load_runs), as (what, value) text rows: what ran and when, its
    code (git, the DVC experiment and the params it changed), the device and threads its params asked for, where it
    ran (runs.environment, recorded at run start: the command, package versions, CPU, GPU, torch threads and device;
    "not recorded" for a run from before) and, from the training stage's summary.json when it is this run's, where
    its seconds went."""
    params = row["params"] or {}
    train = params.get("train") or {}
    rounds = row.get("n_rounds")
    rows = [("what ran", row.get("method_label") or row["algorithm"]), ("run id", row["run_id"]),
            ("dataset / setting", f"{row['dataset']} / {row['setting']}"),
            ("status", row.get("status_shown", row["status"])), ("started", row["started_at"]),
            ("finished", row["finished_at"]),
            ("rounds written", "—" if rounds is None or pd.isna(rounds) or not rounds
             else f"{int(rounds)} (last: {int(row['last_round'])})"),
            ("wall-clock s (rounds)", "—" if pd.isna(row.get("wall_s", float("nan"))) else f"{row['wall_s']:,.1f}"),
            ("git revision", row["git_rev"]), ("DVC experiment", row.get("experiment")),
            ("params it changed", json.dumps(row["changed"], sort_keys=True) if row.get("changed") else None),
            ("device asked (device)", params.get("device")),
            ("threads asked (train.threads)", train.get("threads") or "the executor's default"),
            ("executor (train.executor)", train.get("executor"))]
    environment = row.get("environment") or {}
    if environment:
        keys = [k for k in ENVIRONMENT if k in environment] + [k for k in environment if k not in ENVIRONMENT]
        rows += [(ENVIRONMENT.get(k, k), _packages(environment[k]) if k == "packages" and isinstance(environment[k], dict)
                  else "none" if k == "gpu" and environment[k] is None else environment[k]) for k in keys]
    else:
        rows += [(name, NOT_RECORDED) for name in ("command", "packages", "CPU", "GPU", "torch threads")]
    if summary and summary.get("seconds"):
        rows.append(("seconds, by part (summary.json)", ", ".join(f"{k} {v:g}" for k, v in summary["seconds"].items())))
    return pd.DataFrame([(what, _text(value)) for what, value in rows], columns=["", "value"])
