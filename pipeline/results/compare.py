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

from dataclasses import dataclass


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
