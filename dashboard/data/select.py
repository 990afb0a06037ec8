"""Which runs to show: the default selection (the latest finished run of each method on one set-up), the
set-ups the selected runs differ in, and seed keys (runs that differ only in the seed)."""

from __future__ import annotations

import json

import pandas as pd

from dashboard.data.load import SETUP_KEYS


def seed_key(runs: pd.DataFrame) -> pd.Series:
    """Per run: (algorithm, setting, params without the top-level seed) as one hashable key (runs of one seed
    group share it: dashboard.data.groups)."""
    return pd.Series([(a, st, json.dumps({k: v for k, v in (p or {}).items() if k != "seed"}, sort_keys=True, default=str))
                      for a, st, p in zip(runs["algorithm"], runs["setting"], runs["params"])], index=runs.index, dtype=object)


def seed_of(params) -> str:
    return str((params or {}).get("seed"))


def default_selection(runs: pd.DataFrame) -> list[str]:
    """Per (algorithm, setting): the latest finished run among those of the most common set-up of the
    finished runs (SETUP_KEYS: dataset, clients, rounds), so a 4-round test run or a killed run is not
    picked; without finished runs, the latest run that has written a round (else the latest run). Runs
    differing from a picked one only in their seed (the latest of each seed) are picked with it.
    Finished runs of the workspace come before those of DVC experiments (a sweep's runs vary one param
    each, the Ablations tab's matter): experiments' runs count only when no workspace run finished."""
    if runs.empty:
        return []
    keys = list(SETUP_KEYS)
    done = runs[runs["status"] == "finished"]
    if "experiment" in done:
        workspace = done[done["experiment"].isna() | (done["experiment"] == "")]
        done = workspace if not workspace.empty else done
    if not done.empty:
        setups = done.assign(_k=[tuple(map(str, v)) for v in done[keys].itertuples(index=False)])
        # the most common set-up; a tie goes to the one with the newest run
        counts = setups.groupby("_k").agg(n=("run_id", "size"), newest=("started_at", "max"))
        best = counts.sort_values(["n", "newest"]).index[-1]
        ranked = setups[setups["_k"] == best].sort_values(["started_at", "run_id"])
    else:
        ranked = runs.assign(_has=runs["n_rounds"].fillna(0) > 0).sort_values(["_has", "started_at", "run_id"])
    latest = ranked.groupby(["algorithm", "setting"], sort=False).tail(1)
    # with the other seeds of the same configuration (the latest run of each seed): a seed group
    ranked = ranked.assign(_cfg=seed_key(ranked), _seed=[seed_of(p) for p in ranked["params"]])
    picked = ranked[ranked["_cfg"].isin(set(ranked.loc[latest.index, "_cfg"]))].groupby(["_cfg", "_seed"]).tail(1)
    return picked.sort_values(["setting", "algorithm", "started_at", "run_id"])["run_id"].tolist()


def setup_mismatch(runs: pd.DataFrame, run_ids: list[str]) -> str | None:
    """A warning naming the SETUP_KEYS in which the given runs differ, with each value's runs; None
    when they agree."""
    picked = runs[runs["run_id"].isin(run_ids)]
    parts = []
    for key in SETUP_KEYS:
        values = picked.groupby(picked[key].astype(str), sort=True)["label"].agg(list)
        if len(values) > 1:
            parts.append(f"**{key}** " + "; ".join(f"{v} ({', '.join(labels)})" for v, labels in values.items()))
    if not parts:
        return None
    return "The selected runs are not directly comparable, they differ in " + " · ".join(parts) + "."
