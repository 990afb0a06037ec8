"""The comparison of runs: metrics.json for `dvc metrics show`, a Markdown/CSV table, a plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from pipeline.results import ResultsDB  # noqa: E402

COLUMNS = ("algorithm", "setting", "rounds", "maua", "final_acc", "bytes_total", "bytes_setup", "bytes_training")


def comparison_rows(summaries: list[dict]) -> list[dict]:
    return [{
        "algorithm": s["algorithm"], "setting": s["setting"], "rounds": s["rounds"],
        "maua": round(s["maua"], 4), "final_acc": round(s["final_acc"], 4),
        "bytes_total": s["bytes_total"], "bytes_setup": s["bytes_setup"],
        "bytes_training": s["bytes_total"] - s["bytes_setup"], "run_id": s["run_id"],
    } for s in summaries]


def format_table(rows: list[dict]) -> str:
    head = "| algorithm | setting | rounds | MAUA | final acc | bytes total | bytes set-up | bytes training |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['algorithm']} | {r['setting']} | {r['rounds']} | {r['maua']:.4f} | {r['final_acc']:.4f} | "
                     f"{r['bytes_total']:,} | {r['bytes_setup']:,} | {r['bytes_training']:,} |")
    return "\n".join(lines)


def write_outputs(rows: list[dict], metrics_path: Path, report_dir: Path) -> None:
    report_dir.mkdir(parents=True, exist_ok=True)
    metrics = {r["algorithm"]: {"maua": r["maua"], "final_acc": r["final_acc"], "bytes_total": r["bytes_total"],
                                "bytes_setup": r["bytes_setup"], "rounds": r["rounds"]} for r in rows}
    metrics_path.write_text(json.dumps(metrics, indent=1))
    (report_dir / "comparison.md").write_text(format_table(rows) + "\n")
    with open(report_dir / "comparison.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*COLUMNS, "run_id"])
        writer.writeheader()
        writer.writerows(rows)


def plot_accuracy_vs_bytes(db: ResultsDB, summaries: list[dict], path: Path) -> None:
    """Mean user accuracy vs cumulative bytes (log x), one line per algorithm. Methods that
    send nothing are drawn as horizontal lines at their accuracy curve's best value."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in summaries:
        rounds = [r for r in db.rounds(s["run_id"]) if r[1] is not None]
        cumulative, total, xs, ys = {}, 0, [], []
        for rnd, _, up, down, _ in db.rounds(s["run_id"]):
            total += up + down
            cumulative[rnd] = total
        for rnd, acc, *_ in rounds:
            if cumulative[rnd] > 0:
                xs.append(cumulative[rnd])
                ys.append(acc)
        if xs:
            ax.plot(xs, ys, marker=".", label=s["algorithm"])
        else:
            ax.axhline(s["maua"], linestyle="--", color="grey", label=f"{s['algorithm']} (0 bytes, MAUA)")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative bytes communicated (up + down, incl. set-up)")
    ax.set_ylabel("mean user accuracy")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
