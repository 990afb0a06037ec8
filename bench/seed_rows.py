"""Mean +- std over seeds of a preset's table, one workspace per seed.

    .venv/bin/python bench/seed_rows.py /tmp/t5s0 /tmp/t5s1 /tmp/t5s2

Each workspace is a clone where the same preset ran with a different `-S seed=N` and the report
stage ran after its training stages (`./py -m flows.report`), so results/report/comparison.csv
holds every run with its speed-up against the preset's reference at that seed's level. Prints, per
method and setting, each seed's MAUA and their mean +- sample std (ddof 1), and each seed's
speed-up with and without the one-time set-up upload. Reads files only.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import yaml


def seed_of(workspace: Path) -> int:
    path = workspace / "params.yaml"
    if not path.exists():
        sys.exit(f"error: {path} is missing: give the clones the preset ran in, one per seed")
    return int(yaml.safe_load(path.read_text())["seed"])


def rows_of(workspace: Path) -> list[dict]:
    path = workspace / "results" / "report" / "comparison.csv"
    if not path.exists():
        sys.exit(f"error: {path} is missing: run the report stage there first (cd {workspace} && ./py -m flows.report)")
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workspaces", nargs="+", type=Path, help="one clone per seed, each with its report")
    args = ap.parse_args()

    clones = [(workspace, seed_of(workspace)) for workspace in args.workspaces]
    seeds = sorted(seed for _, seed in clones)
    if len(set(seeds)) < len(seeds):
        sys.exit(f"error: two workspaces ran the same seed (seeds {seeds}): give one clone per seed")
    by_run: dict[tuple[str, str], dict[int, dict]] = {}
    for workspace, seed in clones:
        for row in rows_of(workspace):
            # by method, not label: a label names the knobs off the defaults of its commit, and a default
            # that changed between the seeds' clones (fedcache.consistency, pfedme.personal_lr) renames it
            by_run.setdefault((row["algorithm"], row["setting"]), {})[seed] = row

    def speedups(per_seed: dict[int, dict], key: str) -> str:
        """Each seed's speed-up ("never": the run did not reach the reference's level), then the mean of those
        that did. Bytes per round are fixed, so a speed-up moves in steps of a round and seeds often tie."""
        cells = [("never" if not per_seed[s][key] else f"{float(per_seed[s][key]):,.1f}x") if s in per_seed else "–"
                 for s in seeds]
        reached = [float(per_seed[s][key]) for s in seeds if s in per_seed and per_seed[s][key]]
        return " / ".join(cells) + (f" (mean {statistics.mean(reached):,.1f}x)" if len(reached) > 1 else "")

    print("| run | setting | " + " | ".join(f"seed {s} MAUA" for s in seeds)
          + " | MAUA mean ± std | speed-up by seed, with set-up | without |")
    print("|---" * (len(seeds) + 5) + "|")
    for (_, setting), per_seed in by_run.items():
        label = " / ".join(dict.fromkeys(per_seed[s]["label"] for s in seeds if s in per_seed))
        maua = [float(per_seed[s]["maua"]) * 100 for s in seeds if s in per_seed]
        cells = [f"{float(per_seed[s]['maua']) * 100:.2f}" if s in per_seed else "–" for s in seeds]
        print(f"| {label} | {setting} | " + " | ".join(cells) + f" | {mean_std(maua)} "
              f"| {speedups(per_seed, 'speedup')} | {speedups(per_seed, 'speedup_no_setup')} |")


if __name__ == "__main__":
    main()
