"""bench/seed_rows.py: a preset's table over seeds, one clone's report per seed, rows paired by method
even when a changed default renamed a label."""

import csv
import subprocess
import sys

from conftest import REPO_ROOT

FIELDS = ["algorithm", "label", "setting", "maua", "speedup", "speedup_no_setup"]


def clone(tmp_path, seed: int, rows: list[dict]):
    path = tmp_path / f"seed{seed}"
    (path / "results" / "report").mkdir(parents=True)
    (path / "params.yaml").write_text(f"seed: {seed}\n")
    with (path / "results" / "report" / "comparison.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def run(*args):
    return subprocess.run([sys.executable, "bench/seed_rows.py", *map(str, args)], cwd=REPO_ROOT,
                          capture_output=True, text=True)


def test_rows_are_paired_by_method_with_each_seeds_speed_up(tmp_path):
    a = clone(tmp_path, 0, [{"algorithm": "fedcache", "label": "fedcache", "setting": "homo", "maua": 0.70,
                             "speedup": 100.0, "speedup_no_setup": 120.0}])
    b = clone(tmp_path, 1, [{"algorithm": "fedcache", "label": "fedcache (consistency=live)", "setting": "homo",
                             "maua": 0.74, "speedup": "", "speedup_no_setup": ""}])
    done = run(a, b)
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("| fedcache"))
    assert row.startswith("| fedcache / fedcache (consistency=live) | homo | 70.00 | 74.00 | 72.00 ± 2.83 |")
    assert "100.0x / never" in row and "120.0x / never" in row


def test_a_clone_without_a_report_or_a_repeated_seed_is_refused(tmp_path):
    a = clone(tmp_path, 0, [])
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "params.yaml").write_text("seed: 1\n")
    missing = run(a, tmp_path / "bare")
    assert missing.returncode == 1 and "comparison.csv is missing" in missing.stderr and "flows.report" in missing.stderr
    twice = run(a, a)
    assert twice.returncode == 1 and "two workspaces ran the same seed" in twice.stderr
