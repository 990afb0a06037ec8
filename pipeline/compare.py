"""The comparison table (in the spirit of the FedCache paper's Tables 5 and 6).

Per run: MAUA, total bytes with and without one-time set-up traffic, the bytes needed to
first reach a target mean accuracy, and the speed-up in bytes against the most expensive run
of the same setting (homo/hetero) that reaches the target. Pure functions over the rows of
the `rounds` table, shared by the report stage and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunSeries:
    run_id: str
    algorithm: str
    setting: str
    rounds: list[tuple[int, float | None, int, int]]  # (round, mean_acc, bytes_up, bytes_down), round 0 = set-up

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


def comparison(series: list[RunSeries], target: float | None, include_setup: bool = True) -> list[dict]:
    """One row per run. speedup = (bytes to target of the most expensive run of the same setting
    that reaches it) / (this run's); None when the run never reaches the target or sends nothing."""
    rows = []
    for s in series:
        rows.append({
            "algorithm": s.algorithm, "setting": s.setting, "run_id": s.run_id,
            "rounds": max((r for r, *_ in s.rounds), default=0),
            "maua": s.maua, "final_acc": s.final_acc,
            "bytes_total": s.total_bytes, "bytes_setup": s.setup_bytes,
            "bytes_training": s.total_bytes - s.setup_bytes,
            "target_acc": target, "bytes_to_target": s.bytes_to_target(target, include_setup),
        })
    for setting in {r["setting"] for r in rows}:
        group = [r for r in rows if r["setting"] == setting]
        reached = [r["bytes_to_target"] for r in group if r["bytes_to_target"]]
        worst = max(reached) if reached else None
        for r in group:
            b = r["bytes_to_target"]
            r["speedup"] = (worst / b) if (worst and b) else None
    return rows
