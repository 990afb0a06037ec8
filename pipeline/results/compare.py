"""The comparison table (in the spirit of the FedCache paper's Tables 5 and 6).

Per run: MAUA, total bytes with and without one-time set-up traffic (FedCache's hash upload),
the bytes needed to first reach a target mean accuracy (with and without set-up), and the
speed-up in bytes against a baseline method of the same setting (homo/hetero): `report.baseline`,
FedAvg by default, the parameter-averaging reference the paper measures speed-ups against.
When the baseline never reaches the target, the speed-up is measured at the best accuracy it
did reach (its MAUA), so the column still says how much cheaper a method gets to where the
baseline got; `speedup_target` records that level. A setting without a baseline run falls back
to the most expensive run that reaches the target. Pure functions over the rows of the `rounds`
table, shared by the report stage and the dashboard.

With simulated devices (docs/devices.md), per run also: the simulated seconds to the target (the
`sim_time_s` of the round whose mean accuracy first reaches it: the same rules as the bytes to it)
and to the speed-up's level, the run's simulated seconds, and the waiting share: the share of the
participants' simulated client-seconds (after the set-up) not spent on work the server used (idle
while a sync round waits for its slowest client, or dropped by a deadline or by going offline), from
the round metrics sim_busy_s / sim_client_s. None (the report shows "—" and why) without them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from pipeline.results.intervals import Accuracies, Interval, paired_difference, run_interval

ClientRow = tuple[int, int, float | None, int]  # (round, client, acc, n) of one client's evaluation


@dataclass(frozen=True)
class RunSeries:
    run_id: str
    algorithm: str
    setting: str
    rounds: list[tuple[int, float | None, int, int]]  # (round, mean_acc, bytes_up, bytes_down), round 0 = set-up
    label: str | None = None  # what ran (pipeline.results.labels); None: a run from before labels
    sim_times: dict[int, float] | None = None  # round -> its sim_time_s; None: no simulated clock (devices off)
    busy_s: float | None = None  # the rounds' sim_busy_s summed; None: not recorded
    client_s: float | None = None  # the rounds' sim_client_s summed
    seed: int | None = None  # params.yaml's seed of the run (None: not known)
    clients: list[ClientRow] = field(default_factory=list)  # every client's test accuracy at every evaluation
    val_clients: list[ClientRow] = field(default_factory=list)  # the same on the validation split

    def accuracies(self, split: str = "test") -> Accuracies | None:
        """Per-client accuracies for intervals (pipeline.results.intervals); None without client rows."""
        return self._test_accuracies if split == "test" else self._val_accuracies

    # built once per run: every interval and pair reads them (a frozen dataclass still keeps a cached_property)
    @cached_property
    def _test_accuracies(self) -> Accuracies | None:
        return Accuracies.from_rows(self.clients)

    @cached_property
    def _val_accuracies(self) -> Accuracies | None:
        return Accuracies.from_rows(self.val_clients)

    @property
    def sim_time_s(self) -> float | None:
        """The run's simulated seconds (its last round's instant); None without the clock."""
        return max(self.sim_times.values()) if self.sim_times else None

    @property
    def waiting_share(self) -> float | None:
        """1 - busy / client-seconds over the rounds after the set-up (module doc); None when not recorded."""
        if self.busy_s is None or not self.client_s:
            return None
        return 1.0 - self.busy_s / self.client_s

    def time_to_target(self, target: float | None) -> float | None:
        """Simulated seconds when the mean accuracy first reaches `target` (None if never, no target, or no clock)."""
        if target is None or not self.sim_times:
            return None
        for r, acc, _, _ in sorted(self.rounds):
            if acc is not None and acc >= target:
                return self.sim_times.get(r)
        return None

    @property
    def name(self) -> str:
        """The run's name for people: its label, else (a run from before labels) the bare algorithm."""
        return self.label or self.algorithm

    @property
    def setup_bytes(self) -> int:
        return sum(up + down for r, _, up, down in self.rounds if r == 0)

    @property
    def total_bytes(self) -> int:
        return sum(up + down for _, _, up, down in self.rounds)

    @property
    def maua(self) -> float | None:
        accs = [a for _, a, _, _ in self.rounds if a is not None]
        return max(accs) if accs else None

    @property
    def final_acc(self) -> float | None:
        accs = [a for _, a, _, _ in self.rounds if a is not None]
        return accs[-1] if accs else None

    def bytes_to_target(self, target: float | None, include_setup: bool = True) -> int | None:
        """Cumulative bytes when the mean accuracy first reaches `target` (None if never, or no target)."""
        if target is None:
            return None
        total = 0
        for r, acc, up, down in sorted(self.rounds):
            if r > 0 or include_setup:
                total += up + down
            if acc is not None and acc >= target:
                return total
        return None


def comparison(series: list[RunSeries], target: float | None, include_setup: bool = True,
               baseline: str = "fedavg") -> list[dict]:
    """One row per run. speedup = (bytes the reference needs to reach speedup_target) / (this run's),
    both counted with set-up traffic when include_setup; speedup_no_setup the same without it (as
    the paper counts); None when the run never reaches that level or sends nothing. bytes_to_level
    (and _no_setup): this run's bytes to that level. The reference is the `baseline` run of the same
    setting (see the module doc). `algorithm` is the bare method (speed-ups, the paper's figures look
    runs up by it), `label` what ran (RunSeries.name)."""
    rows = []
    for s in series:
        rows.append({
            "algorithm": s.algorithm, "label": s.name, "setting": s.setting, "run_id": s.run_id,
            "rounds": max((r for r, *_ in s.rounds), default=0),
            "maua": s.maua, "final_acc": s.final_acc,
            "bytes_total": s.total_bytes, "bytes_setup": s.setup_bytes,
            "bytes_training": s.total_bytes - s.setup_bytes,
            "target_acc": target, "bytes_to_target": s.bytes_to_target(target, include_setup),
            "bytes_to_target_no_setup": s.bytes_to_target(target, include_setup=False),
            "sim_time_s": s.sim_time_s, "time_to_target": s.time_to_target(target), "waiting_share": s.waiting_share,
            **run_intervals(s),
        })
    for setting in {r["setting"] for r in rows}:
        group = [(r, s) for r, s in zip(rows, series) if r["setting"] == setting]
        reference, level = _reference(group, target, baseline, include_setup)
        for r, s in group:
            # both ways: the paper's figures leave the one-time set-up out (FedCache's hash upload)
            for key, setup in (("speedup", include_setup), ("speedup_no_setup", False)):
                ref_bytes = reference.bytes_to_target(level, setup) if reference is not None else None
                b = s.bytes_to_target(level, setup)
                r[key] = (ref_bytes / b) if (ref_bytes and b) else None
            r["speedup_target"] = level if reference is not None else None
            r["speedup_vs"] = reference.algorithm if reference is not None else None
            r["bytes_to_level"] = s.bytes_to_target(level) if reference is not None else None
            r["bytes_to_level_no_setup"] = s.bytes_to_target(level, include_setup=False) if reference is not None else None
            r["time_to_level"] = s.time_to_target(level) if reference is not None else None
    return rows


def _reference(group: list[tuple[dict, RunSeries]], target: float | None, baseline: str,
               include_setup: bool) -> tuple[RunSeries | None, float | None]:
    """(the run speed-ups are measured against, the accuracy they are measured at)."""
    if target is None:
        return None, None
    base = [s for _, s in group if s.algorithm == baseline and s.maua is not None and s.total_bytes > 0]
    if base:
        best = max(base, key=lambda s: s.maua)  # several baseline runs: the most accurate
        return best, min(target, best.maua)
    reached = [s for _, s in group if s.bytes_to_target(target, include_setup)]
    if not reached:
        return None, None
    return max(reached, key=lambda s: s.bytes_to_target(target, include_setup)), target


def run_intervals(s: RunSeries) -> dict:
    """The run's MAUA and final accuracy with 95% intervals over its clients, the test-sampling standard error,
    and the validation split's MAUA (what defaults are chosen on). None where the run has no client rows."""
    acc = s.accuracies()
    out = {"maua_low": None, "maua_high": None, "final_low": None, "final_high": None, "test_se": None,
           "n_clients": None, "val_maua": None}
    if acc is not None:
        maua, final = run_interval([acc], "maua"), run_interval([acc], "final_acc")
        out.update(maua_low=maua.low, maua_high=maua.high, final_low=final.low, final_high=final.high,
                   test_se=acc.test_se, n_clients=len(acc.n))
    val = s.accuracies("val")
    if val is not None:
        out["val_maua"] = float(val.statistic("maua"))
    return out


# -- methods across seeds, and paired differences ------------------------------------------------------------

REFERENCES = ("local", "fedcache")  # every method is compared against these (the headline's pairs)


@dataclass(frozen=True)
class Group:
    """One method (a label in a setting) over its seeds."""

    name: str
    algorithm: str
    setting: str
    runs: dict[int | None, RunSeries]  # by seed

    def accuracies(self, seeds: list) -> list[Accuracies]:
        return [self.runs[seed].accuracies() for seed in seeds]


def groups(series: list[RunSeries]) -> list[Group]:
    """The runs by (label, setting), in first-seen order; a second run of the same seed replaces the first."""
    out: dict[tuple[str, str], Group] = {}
    for s in series:
        key = (s.name, s.setting)
        if key not in out:
            out[key] = Group(s.name, s.algorithm, s.setting, {})
        out[key].runs[s.seed] = s
    return list(out.values())


def method_rows(series: list[RunSeries]) -> list[dict]:
    """One row per method (label and setting): MAUA and final accuracy averaged over its seeds with 95%
    intervals (pipeline.results.intervals says what each covers), and its mean bytes."""
    rows = []
    for g in groups(series):
        seeds = [k for k, r in g.runs.items() if r.accuracies() is not None]
        if not seeds:
            continue
        accs = g.accuracies(seeds)
        maua, final = run_interval(accs, "maua"), run_interval(accs, "final_acc")
        runs = [g.runs[k] for k in seeds]
        rows.append({"label": g.name, "algorithm": g.algorithm, "setting": g.setting, "seeds": len(seeds),
                     "maua": maua.estimate, "maua_low": maua.low, "maua_high": maua.high,
                     "final_acc": final.estimate, "final_low": final.low, "final_high": final.high,
                     "bytes_total": sum(r.total_bytes for r in runs) / len(runs),
                     "bytes_training": sum(r.total_bytes - r.setup_bytes for r in runs) / len(runs),
                     "covers": maua.covers})
    return rows


def _reference_group(gs: list[Group], algorithm: str, setting: str) -> Group | None:
    """The reference method of a setting: the run named exactly `algorithm` (no knobs), else the first of it."""
    candidates = [g for g in gs if g.algorithm == algorithm and g.setting == setting]
    plain = [g for g in candidates if g.name == algorithm]
    return (plain or candidates or [None])[0]


def differences(series: list[RunSeries], references: tuple[str, ...] = REFERENCES) -> list[dict]:
    """Every method against each reference (local-only, FedCache) of its setting: the paired difference in
    MAUA and in final accuracy with its 95% interval and the word that follows it ("ahead": the method is
    ahead of the reference; "behind"; "tied": the interval contains 0). Paired by client within a seed and
    by seed across seeds, over the seeds both have; a pair whose clients differ (another partition) is
    left out with the reason in `note`."""
    gs = groups(series)
    rows = []
    for ref_alg in references:
        for setting in dict.fromkeys(g.setting for g in gs):
            ref = _reference_group(gs, ref_alg, setting)
            if ref is None:
                continue
            for g in gs:
                if g is ref or g.setting != setting or any(r["label"] == ref.name and r["vs"] == g.name
                                                           and r["setting"] == setting for r in rows):
                    continue  # itself, another setting, or the mirror of a pair already listed
                seeds = [k for k in g.runs if k in ref.runs and g.runs[k].accuracies() is not None
                         and ref.runs[k].accuracies() is not None]
                row = {"label": g.name, "algorithm": g.algorithm, "vs": ref.name, "setting": setting,
                       "seeds": len(seeds), "note": ""}
                if not seeds:
                    rows.append({**row, "note": "no seed in common"})
                    continue
                try:
                    for name in ("maua", "final_acc"):
                        iv = paired_difference(g.accuracies(seeds), ref.accuracies(seeds), name)
                        row.update({f"{name}_diff": iv.estimate, f"{name}_low": iv.low, f"{name}_high": iv.high,
                                    f"{name}_verdict": iv.verdict, "covers": iv.covers})
                except ValueError as err:
                    row["note"] = f"not paired: {err}"
                rows.append(row)
    return rows


def difference_interval(row: dict, name: str = "maua") -> Interval:
    return Interval(row[f"{name}_diff"], row[f"{name}_low"], row[f"{name}_high"], row.get("covers", ""))


# -- equal budgets: schedules on one grid of simulated instants ----------------------------------------------

GRID_POINTS = 10  # instants of the common grid: the budget's tenths


def _on_grid(s: RunSeries, grid: list[float]) -> Accuracies | None:
    """The run's per-client accuracy at each grid instant: a client's accuracy at t is that of the run's last
    evaluation at or before t (a step function: what a user would have had at that instant)."""
    evaluated = sorted(r for r in {r for r, _, a, _ in s.clients if a is not None} if r in (s.sim_times or {}))
    if not evaluated:
        return None
    at = {(r, k): (a, n) for r, k, a, n in s.clients if a is not None}
    clients = sorted({k for _, k, a, n in s.clients if a is not None and n > 0})
    acc = []
    for t in grid:
        before = [r for r in evaluated if s.sim_times[r] <= t + 1e-9]
        r = before[-1] if before else evaluated[0]  # before the first evaluation: the initial models' (round 0)
        acc.append([at[(r, k)][0] for k in clients])
    n = {k: at[(evaluated[-1], k)][1] for k in clients}
    return Accuracies(np.array(acc, dtype=np.float64).T, np.array([n[k] for k in clients], dtype=np.int64))


def time_to_target(mean: np.ndarray, grid: np.ndarray, target: float) -> float:
    """Simulated seconds at which a mean-accuracy curve on the grid first reaches `target`, linearly interpolated
    between the grid instants around the crossing (inf: not within the budget)."""
    above = np.flatnonzero(mean >= target)
    if not len(above):
        return math.inf
    i = int(above[0])
    if i == 0:
        return float(grid[0])
    (t0, t1), (a0, a1) = grid[i - 1:i + 1], mean[i - 1:i + 1]
    return float(t0 + (target - a0) / (a1 - a0) * (t1 - t0))


def budget_rows(series: list[RunSeries], target: float | None, points: int = GRID_POINTS) -> list[dict]:
    """Timed runs (devices.enabled) of each setting and seed on one grid: `points` equally spaced simulated
    instants up to the common budget, the shortest run's simulated time, so every schedule gets the same time.
    Per run: the mean accuracy at the budget and the best on the grid, with 95% intervals over clients, the
    time to `target` interpolated on the grid with its interval (a percentile bootstrap over clients; inf where
    a resample does not reach it), and, for a run under another schedule than sync, its paired difference in
    accuracy at the budget against the same method's sync run."""
    from pipeline.results.intervals import bootstrap_percentile, paired_difference, run_interval

    rows = []
    timed = [s for s in series if s.sim_times and s.clients]
    for key in dict.fromkeys((s.setting, s.seed) for s in timed):
        group = [s for s in timed if (s.setting, s.seed) == key]
        budget = min(s.sim_time_s for s in group)
        grid = np.array([budget * (i + 1) / points for i in range(points)])
        on_grid = {s.run_id: _on_grid(s, list(grid)) for s in group}
        for s in group:
            acc = on_grid[s.run_id]
            if acc is None:
                continue
            final, best = run_interval([acc], "final_acc"), run_interval([acc], "maua")
            row = {"label": s.name, "algorithm": s.algorithm, "setting": s.setting, "seed": s.seed,
                   "budget_s": budget, "points": points, "acc_at_budget": final.estimate,
                   "acc_low": final.low, "acc_high": final.high, "best_on_grid": best.estimate,
                   "best_low": best.low, "best_high": best.high, "target": target, "time_to_target": None,
                   "time_low": None, "time_high": None, "vs": None, "diff": None, "diff_low": None,
                   "diff_high": None, "verdict": None}
            if target is not None:
                row["time_to_target"] = time_to_target(acc.acc.mean(axis=0), grid, target)
                row["time_low"], row["time_high"] = bootstrap_percentile(
                    len(acc.n), lambda idx: np.apply_along_axis(
                        lambda m: time_to_target(m, grid, target), -1, acc.acc[idx].mean(axis=-2)))
            sync = next((o for o in group if o.algorithm == s.algorithm and schedule_of(o.name) == "sync"), None)
            if sync is not None and sync is not s and on_grid[sync.run_id] is not None:
                try:
                    iv = paired_difference([acc], [on_grid[sync.run_id]], "final_acc")
                    row.update(vs=sync.name, diff=iv.estimate, diff_low=iv.low, diff_high=iv.high, verdict=iv.verdict)
                except ValueError:
                    pass
            rows.append(row)
    return rows


def schedule_of(label: str) -> str:
    """A run's schedule from its label (pipeline.results.labels names a non-sync one: "schedule=async")."""
    for name in ("async", "deadline"):
        if f"schedule={name}" in label:
            return name
    return "sync"
