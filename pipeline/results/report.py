"""The report's files: metrics.json for `dvc metrics show`, the comparison as Markdown/CSV, a plot."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from pipeline.results.compare import RunSeries, difference_interval
from pipeline.results.intervals import Interval, covers, percent
from pipeline.results.privacy import METRICS as PRIVACY_METRICS
from pipeline.results.privacy import format_privacy
from pipeline.results.store import DIFFERENCE_COLUMNS

COLUMNS = ("algorithm", "label", "setting", "rounds", "maua", "final_acc", "bytes_total", "bytes_setup",
           "bytes_training", "target_acc", "bytes_to_target", "bytes_to_target_no_setup", "speedup", "speedup_no_setup",
           "speedup_target", "speedup_vs", "bytes_to_level", "bytes_to_level_no_setup", "sim_time_s", "time_to_target",
           "time_to_level", "waiting_share", "maua_low", "maua_high", "final_low", "final_high", "test_se", "n_clients",
           "val_maua", "run_id")


def _name(row: dict) -> str:
    # metrics.json's keys: the bare method, so that `dvc metrics diff` pairs the same stage across commits
    return row["algorithm"] if row["setting"] == "homo" else f"{row['algorithm']}-{row['setting']}"


def _shown(row: dict) -> str:
    """The method column: what ran (the label, e.g. "pdfl (order=body_then_head)"), else the bare method."""
    return row.get("label") or row["algorithm"]


def _bytes(b: int | None) -> str:
    return "not reached" if b is None else f"{b:,}"


def _speedup(row: dict, key: str = "speedup") -> str:
    if row[key] is None:
        return "—"
    return f"{row[key]:.1f}x vs {row['speedup_vs']} at {row['speedup_target']:.2%}"


def _gb(b: int | None, row: dict) -> str:
    if row["speedup_target"] is None:
        return "—"
    return f"not reached ({row['speedup_target']:.2%})" if b is None else f"{b / 1e9:.4f} (to {row['speedup_target']:.2%})"


NO_CLOCK = "— (no simulated time: devices off)"


def timed(rows: list[dict]) -> bool:
    """Whether any run has simulated time (the table then gains its time columns)."""
    return any(r.get("sim_time_s") is not None for r in rows)


def _time(row: dict, key: str = "time_to_target") -> str:
    """Simulated seconds to the target: "not reached", or "—" and why when the run has no simulated time."""
    if row.get("sim_time_s") is None:
        return NO_CLOCK
    if row["target_acc"] is None:
        return "— (no target)"
    return "not reached" if row.get(key) is None else f"{row[key]:,.1f} s"


def _waiting(row: dict) -> str:
    if row.get("sim_time_s") is None:
        return NO_CLOCK
    if row.get("waiting_share") is None:
        return "— (not recorded: a run from before the waiting figures)"
    return f"{row['waiting_share']:.1%}"


def _acc(row: dict, name: str = "maua") -> str:
    """A run's accuracy with its 95% interval over clients, to the precision the interval supports."""
    low, high = ("maua_low", "maua_high") if name == "maua" else ("final_low", "final_high")
    if row.get(low) is None:
        return f"{row[name]:.2%}"
    return percent(Interval(row[name], row[low], row[high], ""))


def format_table(rows: list[dict]) -> str:
    """Markdown: one row per run; bytes to the target with and without the one-time set-up traffic; when any
    run has simulated time (docs/devices.md), its simulated seconds, the time to the target and the waiting share."""
    target = next((r["target_acc"] for r in rows if r["target_acc"] is not None), None)
    reach = f"bytes to {target:.0%}" if target is not None else "bytes to target"
    clock = timed(rows)
    times = f" simulated s | time to {target:.0%} |" if target is not None else " simulated s | time to target |"
    lines = [f"| method | setting | rounds | MAUA [95% CI] | final acc [95% CI] | bytes total | bytes w/o set-up | {reach} | "
             f"{reach} w/o set-up |{times if clock else ''}{' waiting share |' if clock else ''} speed-up | "
             f"speed-up w/o set-up |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if clock else "") + "---|---|"]
    for r in rows:
        sim = ("—" if r.get("sim_time_s") is None else f"{r['sim_time_s']:,.1f}")
        extra = f" {sim} | {_time(r)} | {_waiting(r)} |" if clock else ""
        lines.append(f"| {_shown(r)} | {r['setting']} | {r['rounds']} | {_acc(r)} | {_acc(r, 'final_acc')} | "
                     f"{r['bytes_total']:,} | {r['bytes_training']:,} | {_bytes(r['bytes_to_target'])} | "
                     f"{_bytes(r['bytes_to_target_no_setup'])} |{extra} {_speedup(r)} | "
                     f"{_speedup(r, 'speedup_no_setup')} |")
    se = [r["test_se"] for r in rows if r.get("test_se") is not None]
    if se:
        lines.append(f"\nIntervals: 95%, over clients ({covers(1)}); the columns are per run, so use the paired "
                     f"differences below to compare methods. Test-sampling standard error of a final mean client "
                     f"accuracy (each client's binomial variance on its own test split): "
                     f"{min(se) * 100:.2f} to {max(se) * 100:.2f} points.")
    if clock:
        lines.append("\nSimulated seconds (docs/devices.md): time to the target is the round's simulated instant when "
                     "the mean accuracy first reaches it; the waiting share is the share of the participants' simulated "
                     "client-seconds after the set-up not spent on an update the server used (idle while others finish "
                     "a sync round, or dropped).")
    return "\n".join(lines)


def format_differences(rows: list[dict]) -> str:
    """Markdown: each method minus each reference (local-only, FedCache), paired, with the word that follows
    the 95% interval: "ahead" / "behind" only when it excludes 0, else "tied"."""
    if not rows:
        return ""
    lines = ["| method | vs | setting | seeds | MAUA difference, points [95% CI] | MAUA | final acc difference, "
             "points [95% CI] | final acc |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("maua_diff") is None:
            lines.append(f"| {r['label']} | {r['vs']} | {r['setting']} | {r['seeds']} | — ({r['note']}) | | | |")
            continue
        lines.append(f"| {r['label']} | {r['vs']} | {r['setting']} | {r['seeds']} | "
                     f"{percent(difference_interval(r), signed=True)} | {r['maua_verdict']} | "
                     f"{percent(difference_interval(r, 'final_acc'), signed=True)} | {r['final_acc_verdict']} |")
    how = next((r["covers"] for r in rows if r.get("covers")), "")
    lines.append(f"\nPaired by client within a seed and by seed across seeds; intervals cover {how}. \"ahead\" or "
                 "\"behind\" only when the interval excludes 0; otherwise \"tied\".")
    return "\n".join(lines)


def format_methods(rows: list[dict]) -> str:
    """Markdown: each method over its seeds (MAUA and final accuracy with 95% intervals, mean bytes)."""
    lines = ["| method | setting | seeds | MAUA [95% CI] | final acc [95% CI] | bytes (mean) | bytes w/o set-up |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['setting']} | {r['seeds']} | {_acc(r)} | {_acc(r, 'final_acc')} | "
                     f"{r['bytes_total']:,.0f} | {r['bytes_training']:,.0f} |")
    how = next((r["covers"] for r in rows), "")
    lines.append(f"\nIntervals: 95%, {how}.")
    return "\n".join(lines)


def verdict_line(rows: list[dict]) -> str:
    """One line a person reads first: each method against each reference in words that follow the intervals."""
    words = {"ahead": "ahead of", "behind": "behind", "tied": "tied with"}
    parts = [f"{r['label']} {words[r['maua_verdict']]} {r['vs']} "
             f"({percent(difference_interval(r), signed=True)} points)"
             for r in rows if r.get("maua_diff") is not None]
    return "MAUA: " + "; ".join(parts) + "." if parts else ""


def _seconds(value: float | None) -> str:
    return "not within the budget" if value is None or math.isinf(value) else f"{value:,.1f} s"


def format_budget(rows: list[dict]) -> str:
    """Markdown: timed runs (schedules) on one grid of simulated instants up to their common budget
    (compare.budget_rows): accuracy at the budget and the best on the grid with 95% intervals, the time to
    the target interpolated on the grid with its interval, and each non-sync run against the same method's
    sync run, paired, with its word."""
    if not rows:
        return ""
    target = next((r["target"] for r in rows if r["target"] is not None), None)
    lines = [f"Equal budget: every timed run read on the same {rows[0]['points']} simulated instants up to the "
             f"shortest run's {rows[0]['budget_s']:,.1f} s (a client's accuracy at an instant is its last "
             f"evaluation's before it).", "",
             f"| run | seed | accuracy at {rows[0]['budget_s']:,.1f} s [95% CI] | best on the grid [95% CI] | "
             f"time to {'target' if target is None else f'{target:.0%}'} [95% CI] | against the same method's sync "
             "run, points [95% CI] | |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = percent(Interval(r["acc_at_budget"], r["acc_low"], r["acc_high"], ""))
        best = percent(Interval(r["best_on_grid"], r["best_low"], r["best_high"], ""))
        time_ = ("—" if r["time_to_target"] is None else
                 f"{_seconds(r['time_to_target'])} [{_seconds(r['time_low'])}, {_seconds(r['time_high'])}]")
        diff = ("—" if r["diff"] is None else
                f"{percent(Interval(r['diff'], r['diff_low'], r['diff_high'], ''), signed=True)} vs {r['vs']}")
        lines.append(f"| {r['label']} | {r['seed']} | {acc} | {best} | {time_} | {diff} | {r['verdict'] or ''} |")
    return "\n".join(lines)


def format_paper_table(rows: list[dict], dataset: str, figures: list | None = None) -> str:
    """Markdown: each measured run beside the FedCache paper's figure for the same (dataset, method,
    setting) (paper/fedcache_tables.csv), with the MAUA difference in points; "" when the paper has none.
    The paper's GB are to its own target and its speed-ups against its table's reference method, both
    without the one-time set-up upload (its 0.08 GB for FedCache could not hold the codes of 60k
    samples): ours are given with and without it, to the level the speed-ups are measured at, and the
    figures without it are the ones to read beside the paper's."""
    from pipeline.results import paper

    figures = paper.load() if figures is None else figures
    lines = []
    for r in rows:
        p = paper.lookup(figures, dataset, r["algorithm"], r["setting"])
        if p is None:
            continue
        diff = "—" if p.maua is None else f"{(r['maua'] - p.maua) * 100:+.1f}"
        lines.append(f"| {_shown(r)} | {r['setting']} | {_acc(r)} | "
                     f"{'-' if p.maua is None else f'{p.maua:.2%}'} (Table {p.table}) | {diff} | "
                     f"{_gb(r['bytes_to_level'], r)} | {_gb(r['bytes_to_level_no_setup'], r)} | "
                     f"{'-' if p.comm_gb is None else f'{p.comm_gb:g}'} | {_speedup(r)} | "
                     f"{_speedup(r, 'speedup_no_setup')} | "
                     f"{'-' if p.speedup is None else f'{p.speedup:g}x vs {p.reference}'} |")
    if not lines:
        return ""
    head = ["| method | setting | MAUA [95% CI] | paper MAUA | difference (points) | GB to the level (with set-up) | "
            "GB to the level w/o set-up | paper GB to its target (w/o set-up) | speed-up (with set-up) | "
            "speed-up w/o set-up | paper speed-up (w/o set-up) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + lines)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def write_outputs(rows: list[dict], metrics_path: Path, report_dir: Path, dataset: str | None = None,
                  diffs: list[dict] | None = None, budget: list[dict] | None = None,
                  privacy: list[dict] | None = None, noise: dict[str, dict] | None = None) -> None:
    """metrics.json and report_dir's comparison.md / .csv, differences.csv; `privacy`: the audited runs' rows
    (pipeline/results/privacy.py), in metrics.json under each run's "privacy" and as a table in comparison.md;
    `noise`: run name -> its noise on uploads and epsilon (privacy.noise_of), under the run's "dp"."""
    report_dir.mkdir(parents=True, exist_ok=True)
    diffs = diffs or []
    metrics = {}
    for r in rows:
        metrics[_name(r)] = {"maua": round(r["maua"], 4), "final_acc": round(r["final_acc"], 4),
                             "bytes_total": r["bytes_total"], "bytes_setup": r["bytes_setup"], "rounds": r["rounds"],
                             "maua_low": _rounded(r.get("maua_low")), "maua_high": _rounded(r.get("maua_high")),
                             "test_se": _rounded(r.get("test_se")), "val_maua": _rounded(r.get("val_maua"))}
        for d in diffs:  # the paired differences against the references, with their words
            if d["label"] == r["label"] and d["setting"] == r["setting"] and d.get("maua_diff") is not None:
                metrics[_name(r)][f"vs_{d['vs']}"] = {"maua_diff": round(d["maua_diff"], 4),
                                                      "low": round(d["maua_low"], 4), "high": round(d["maua_high"], 4),
                                                      "verdict": d["maua_verdict"]}
    for p in privacy or []:
        if p["run"] in metrics:
            metrics[p["run"]]["privacy"] = {k: p[k] for k in PRIVACY_METRICS if p.get(k) is not None}
    for name, dp in (noise or {}).items():
        if name in metrics:
            metrics[name]["dp"] = dp
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(metrics, indent=1) + "\n")
    text = format_table(rows) + "\n"
    if diffs:
        text += f"\n{verdict_line(diffs)}\n\n{format_differences(diffs)}\n"
    if budget:
        text += f"\n{format_budget(budget)}\n"
    if privacy:
        text += f"\nWhat a curious server and a model holder learn (95% intervals over the audited clients; " \
                f"docs/privacy.md):\n\n{format_privacy(privacy)}\n"
    beside = format_paper_table(rows, dataset) if dataset else ""
    if beside:
        text += f"\nThe FedCache paper's figures for the same dataset, method and setting (paper/fedcache_tables.csv; " \
                f"its scale: K = 300, all training samples):\n\n{beside}\n"
    (report_dir / "comparison.md").write_text(text)
    with open(report_dir / "comparison.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with open(report_dir / "differences.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=DIFFERENCE_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(diffs)


def _pyplot():
    """matplotlib's pyplot drawing to files only (no display), imported when a plot is made: importing this module
    for its tables (the tests, the dashboard) does not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy_vs_sim_time(runs: list[RunSeries], path: Path) -> bool:
    """Mean user accuracy vs simulated seconds (docs/devices.md), one line per run that has simulated time;
    False (no file) when none has."""
    timed_runs = [s for s in runs if s.sim_times]
    if not timed_runs:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for series in timed_runs:
        label = series.name if series.setting == "homo" else f"{series.name}, {series.setting}"
        points = [(series.sim_times[r], acc) for r, acc, _, _ in series.rounds
                  if acc is not None and r in series.sim_times]
        ax.plot([t for t, _ in points], [a for _, a in points], marker=".", label=label)
    ax.set_xlabel("simulated time (s, from the run's start)")
    ax.set_ylabel("mean user accuracy")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_accuracy_vs_bytes(runs: list[RunSeries], path: Path) -> None:
    """Mean user accuracy vs cumulative bytes (log x, set-up included), one line per run. Runs that
    send nothing are drawn as horizontal dashed lines at their MAUA."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for series in runs:
        label = series.name if series.setting == "homo" else f"{series.name}, {series.setting}"
        total, xs, ys = 0, [], []
        for _, acc, up, down in series.rounds:
            total += up + down
            if acc is not None and total > 0:
                xs.append(total)
                ys.append(acc)
        if xs:
            ax.plot(xs, ys, marker=".", label=label)
        else:
            ax.axhline(series.maua, linestyle="--", color="grey", label=f"{label}: 0 bytes (MAUA)")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bytes communicated (up + down, set-up included)")
    ax.set_ylabel("mean user accuracy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
