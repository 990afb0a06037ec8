"""Runs' params: flattened, compared (what differs between runs) and filtered by a key's values."""

from __future__ import annotations

import json

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
