"""Curves, clients, the knowledge cache and the bytes by what they carry, from a snapshot."""

from __future__ import annotations


import pandas as pd

from dashboard.data.load import CACHE_METRICS, Snapshot


def run_algorithms(snap: Snapshot, run_ids: list[str]) -> dict[str, str]:
    """Legend label -> algorithm of the given runs, in order (the charts' colour per method)."""
    algo = snap.runs.set_index("run_id")["algorithm"]
    return {snap.label(r): algo[r] for r in run_ids if r in algo.index}


def _with_run(snap: Snapshot, df: pd.DataFrame) -> pd.DataFrame:
    """Adds the legend label and the algorithm of each row's run."""
    algo = snap.runs.set_index("run_id")["algorithm"]
    df["run"] = [snap.label(r) for r in df["run_id"]]
    df["algorithm"] = [algo.get(r, "") for r in df["run_id"]]
    return df


def smoothed(curves: pd.DataFrame, weight: float) -> pd.DataFrame:
    """The curves with each run's mean accuracy as an exponential moving average (weight 0: as is; 0.9:
    heavy), bias-corrected at the start as TensorBoard's slider does; the measured values stay in
    `mean_acc_raw`. Only what is drawn is smoothed: MAUA and bytes to target read the raw rounds."""
    out = curves.copy()
    out["mean_acc_raw"] = out["mean_acc"]
    if weight > 0 and not out.empty:
        out["mean_acc"] = out.groupby("run_id", sort=False)["mean_acc"].transform(
            lambda acc: acc.ewm(alpha=1 - weight, adjust=True).mean())
    return out


def accuracy_curves(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Per run and evaluated round: mean accuracy, cumulative bytes (up + down) and cumulative
    wall-clock seconds (the rounds' wall_s) so far."""
    cols = ["run", "algorithm", "run_id", "round", "mean_acc", "cum_bytes", "cum_s", "sim_s"]
    if snap.rounds.empty:
        return pd.DataFrame(columns=cols)
    df = snap.rounds.copy()
    per_round = df["bytes_up"].astype("int64") + df["bytes_down"].astype("int64")
    if not include_setup:
        per_round = per_round.where(df["round"] > 0, 0)
    df["cum_bytes"] = per_round.groupby(df["run_id"]).cumsum()
    df["cum_s"] = df["wall_s"].fillna(0).groupby(df["run_id"]).cumsum()
    # the round's simulated instant (devices.enabled; already cumulative from the run's start), else NaN
    df["sim_s"] = df["sim_time_s"] if "sim_time_s" in df else float("nan")
    df = _with_run(snap, df).dropna(subset=["mean_acc"])
    return df[cols].reset_index(drop=True)


def best_round_clients(snap: Snapshot) -> pd.DataFrame:
    """Every client's accuracy at its run's best round (the round of the MAUA)."""
    cols = ["run", "algorithm", "run_id", "round", "client_id", "acc", "n_test"]
    evaluated = snap.rounds.dropna(subset=["mean_acc"])
    if evaluated.empty or snap.clients.empty:
        return pd.DataFrame(columns=cols)
    best = evaluated.loc[evaluated.groupby("run_id", sort=False)["mean_acc"].idxmax(), ["run_id", "round"]]
    df = _with_run(snap, snap.clients.merge(best, on=["run_id", "round"]))
    return df[cols].reset_index(drop=True)


def client_history(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = _with_run(snap, snap.clients[snap.clients["client_id"] == client_id].copy())
    return df[["run", "algorithm", "run_id", "round", "acc", "n_test"]].reset_index(drop=True)


def client_bytes(snap: Snapshot, client_id: int) -> pd.DataFrame:
    df = snap.comm_clients[snap.comm_clients["client_id"] == client_id].copy()
    df["run"] = [snap.label(r) for r in df["run_id"]]
    return df[["run", "direction", "kind", "bytes"]].reset_index(drop=True)


def client_bytes_table(snap: Snapshot, client_id: int) -> pd.DataFrame:
    """One row per run: the bytes client `client_id` sent ("up: knowledge") and received ("down: ...")
    by what they carry (KIND_FAMILIES), up first, in FAMILY_ORDER; only the columns some run has. What a client
    received from its peers (pDFL: their models and knowledge) is its "down"."""
    df = client_bytes(snap, client_id)
    if df.empty:
        return pd.DataFrame(columns=["run"])
    df["column"] = [f"{d}: {family(k)}" for d, k in zip(df["direction"], df["kind"])]
    table = df.pivot_table(index="run", columns="column", values="bytes", aggfunc="sum", sort=False)
    rank = {f: i for i, f in enumerate(FAMILY_ORDER)}
    order = sorted(table.columns, key=lambda c: (c.split(": ")[0] != "up", rank.get(c.split(": ", 1)[1], 99), c))
    return table[order].reset_index()


def cache_stats(snap: Snapshot) -> pd.DataFrame:
    """Per selected run that recorded its knowledge cache (FedCache) and evaluated round: the four
    CACHE_METRICS as columns (NaN where a round has none: the teacher figures before any sample has a
    teacher) beside the run's mean user accuracy, in the selection's run order."""
    cols = ["run", "algorithm", "run_id", "round", *CACHE_METRICS, "mean_acc"]
    if snap.metrics.empty:
        return pd.DataFrame(columns=cols)
    wide = snap.metrics.pivot_table(index=["run_id", "round"], columns="name", values="value", aggfunc="last",
                                    sort=False).reset_index()
    for name in CACHE_METRICS:
        if name not in wide:
            wide[name] = float("nan")
    wide = wide.merge(snap.rounds[["run_id", "round", "mean_acc"]], on=["run_id", "round"], how="left")
    order = {r: i for i, r in enumerate(dict.fromkeys(snap.metrics["run_id"]))}
    wide = wide.sort_values(["run_id", "round"], key=lambda c: c.map(order) if c.name == "run_id" else c)
    wide = _with_run(snap, wide.reset_index(drop=True))
    return wide[cols].astype({n: "float64" for n in [*CACHE_METRICS, "mean_acc"]}).reset_index(drop=True)


# What a payload kind carries (the ledger's kinds, pipeline/methods): four families a reader compares methods by.
KIND_FAMILIES = {"hashes": "set-up", "logits": "knowledge", "knowledge": "knowledge", "class_logits": "knowledge",
                 "server_logits": "knowledge", "params": "parameters", "model": "parameters", "feedback": "parameters",
                 "global": "parameters", "block1": "parameters", "block2": "parameters", "block3": "parameters",
                 "prototypes": "features", "features": "features"}
FAMILY_ORDER = ["set-up", "knowledge", "parameters", "features"]


def family(kind: str) -> str:
    """'logits' -> 'knowledge'; a kind no method here sends stays itself."""
    return KIND_FAMILIES.get(kind, kind)


def _traffic(snap: Snapshot, include_setup: bool) -> pd.DataFrame:
    df = snap.comm_rounds
    if not include_setup:
        df = df[df["round"] > 0]
    df = df.assign(family=[family(k) for k in df["kind"]])
    return _with_run(snap, df.reset_index(drop=True))


def bytes_by_family(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Total bytes per run, family and direction (`flow`: 'knowledge up'), with the kinds it sums."""
    df = _traffic(snap, include_setup)
    columns = ["run", "algorithm", "family", "direction", "flow", "kinds", "bytes"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    out = df.groupby(["run", "algorithm", "family", "direction"], sort=False, as_index=False).agg(
        kinds=("kind", lambda k: ", ".join(sorted(set(k)))), bytes=("bytes", "sum"))
    out["flow"] = out["family"] + " " + out["direction"]
    rank = {f: i for i, f in enumerate(FAMILY_ORDER)}  # the families in reading order, then any other; up first
    out = out.sort_values(["family", "direction"], key=lambda c: c.map(rank).fillna(len(rank)) if c.name == "family"
                          else c.map({"up": 0, "down": 1}), kind="stable")
    return out[columns].reset_index(drop=True)


def bytes_per_round(snap: Snapshot, include_setup: bool = True) -> pd.DataFrame:
    """Bytes per run and round, up and down and their total (every selected run, one line each). A peer's payload
    (decentralized methods) is up for its sender and down for its receiver, and counts once in the total."""
    df = _traffic(snap, include_setup)
    columns = ["run", "run_id", "algorithm", "round", "up", "down", "bytes"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    received = df["received"].fillna(False).astype(bool) if "received" in df else pd.Series(False, index=df.index)
    df = df.assign(direction=df["direction"].where(~received, "received"))
    out = df.pivot_table(index=["run", "run_id", "algorithm", "round"], columns="direction", values="bytes",
                         aggfunc="sum", fill_value=0).reset_index()
    for direction in ("up", "down", "received"):
        if direction not in out:
            out[direction] = 0
    out["bytes"] = out["up"] + out["down"]
    out["down"] = out["down"] + out["received"]
    return out[columns].sort_values(["run", "round"]).reset_index(drop=True)
