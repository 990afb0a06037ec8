"""docs/privacy.md's measured section, from the audits of real runs (issue 40): no figure on the page is typed by hand.

    .venv/bin/python bench/privacy_docs.py collect WORKSPACE [--bits BITS=WORKSPACE ...] [--noise SIGMA=WORKSPACE ...]
    .venv/bin/python bench/privacy_docs.py noise WORKSPACE --noise SIGMA=WORKSPACE ...   # the noise curve alone
    .venv/bin/python bench/privacy_docs.py           # rewrite docs/privacy.md's section from bench/results/
    .venv/bin/python bench/privacy_docs.py --check   # exit 1 when the page differs from what the files render

`collect` reads a workspace where `dvc repro` ran (results/audit/*/audit.json, results/metrics.json) and, for the
hash-bits defence curve, workspaces of the same params with `encode.bits` changed (FedCache only), for the noise
defence curve, workspaces of the same params with `train.dp_noise` (and `train.dp_clip`) set (FedCache only), and
writes bench/results/privacy-<cpu>.json: each method's privacy figures beside its accuracy and bytes, the audit's
seconds, FedCache's reconstruction against its accuracy at each number of bits, and FedCache's accuracy, epsilon and
audit figures at each noise multiplier. `noise` puts the noise curve (WORKSPACE: FedCache without noise, or at its
own train.dp_noise) into this CPU's existing file, keeping its other figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from docs_section import replace_section, write_or_check  # noqa: E402

from pipeline.results.privacy import epsilon_cell, format_privacy, privacy_row  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "privacy.md"
BEGIN, END = "<!-- privacy measured: begin (bench/privacy_docs.py) -->", "<!-- privacy measured: end -->"
HEADING = "## Measured on the default run"
NOT_MEASURED = "Not measured yet on any CPU."


def _audits(workspace: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((workspace / "results/audit").glob("*/audit.json"))}


def _metrics(workspace: Path) -> dict:
    path = workspace / "results/metrics.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _params(workspace: Path) -> dict:
    import yaml

    return yaml.safe_load((workspace / "params.yaml").read_text())


def _summary(workspace: Path, name: str) -> dict:
    path = workspace / "results/runs" / name / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _paired(workspace: Path, noise: dict[float, Path]) -> dict[float, dict]:
    """Each noised run's MAUA against the workspace's (sigma 0), paired by client (pipeline.results.compare's
    differences); none where a run's results file is missing."""
    from pipeline.results.compare import differences
    from pipeline.results.store import ResultsDB

    series = {}
    for sigma, place in {0.0: workspace, **noise}.items():
        path, summary = place / "results/runs/fedcache/run.duckdb", _summary(place, "fedcache")
        if path.is_file() and "run_id" in summary:
            series[sigma] = ResultsDB(path).series([summary["run_id"]])[0]
    if 0.0 not in series:
        return {}
    labels = {s.label: sigma for sigma, s in series.items()}
    return {labels[d["label"]]: d for d in differences(list(series.values()))
            if d["vs"] == series[0.0].label and d["label"] in labels and d.get("maua_diff") is not None}


def noise_curve(workspace: Path, noise: dict[float, Path]) -> list[dict]:
    """FedCache at each noise multiplier (the workspace's own, then `noise`'s): its accuracy (and, against the
    workspace's run without noise, the paired difference), its epsilon (from the run's summary) and its audit's
    figures, one row a multiplier, the smallest first."""
    train = _params(workspace)["train"]
    paired = _paired(workspace, noise) if float(train.get("dp_noise", 0)) == 0 else {}
    curve = []
    for sigma, place in sorted({float(train.get("dp_noise", 0)): workspace, **noise}.items()):
        audit, m = _audits(place).get("fedcache"), _metrics(place).get("fedcache", {})
        if audit is None:
            continue
        p = _params(place)["train"]
        row = privacy_row("fedcache", audit, _summary(place, "fedcache"))
        d = paired.get(sigma, {})
        curve.append({"sigma": sigma, "clip": p.get("dp_clip"), "dp": row["dp"], "maua": m.get("maua"),
                      "maua_low": m.get("maua_low"), "maua_high": m.get("maua_high"),
                      "vs_off": None if not d else {"mean": d["maua_diff"], "low": d["maua_low"],
                                                    "high": d["maua_high"], "verdict": d["maua_verdict"]},
                      **{k: row[k] for k in ("psnr", "mia_auc", "mia_tpr", "lira_auc", "label_tv")}})
    return curve


def collect(workspace: Path, bits: dict[int, Path], noise: dict[float, Path] | None = None) -> dict:
    """The result file's content (see the module docstring)."""
    from pipeline.machine import cpu_description

    metrics, params = _metrics(workspace), _params(workspace)
    rows = []
    for name, audit in _audits(workspace).items():
        if not audit.get("captured", True):
            continue
        m = metrics.get(name, {})
        kept = workspace / "results/runs" / name / "audit"  # what training kept for the audit (audit.capture)
        rows.append({**privacy_row(name, audit), "maua": m.get("maua"), "maua_low": m.get("maua_low"),
                     "maua_high": m.get("maua_high"), "bytes_total": m.get("bytes_total"),
                     "seconds": audit.get("seconds"), "summary": audit.get("summary"),
                     "kept_bytes": sum(f.stat().st_size for f in kept.glob("*") if f.is_file())})
    curve = []
    for n, place in sorted({int(params["encode"]["bits"]): workspace, **bits}.items(), reverse=True):
        fedcache = _audits(place).get("fedcache")
        m = _metrics(place).get("fedcache", {})
        if fedcache is None or not fedcache.get("reconstruction", {}).get("applies"):
            continue
        rec = fedcache["reconstruction"]
        curve.append({"bits": n, "maua": m.get("maua"), "maua_low": m.get("maua_low"), "maua_high": m.get("maua_high"),
                      "bytes_setup": m.get("bytes_setup"), "psnr": rec["psnr"], "ssim": rec["ssim"],
                      "baseline_psnr": rec["baseline_psnr"]})
    p = params
    return {"cpu": cpu_description(), "date": time.strftime("%Y-%m-%d"),
            "setting": (f"{p['data']['dataset']}, K = {p['partition']['num_clients']}, "
                        f"{p['partition']['samples_per_client']} samples a client, {p['train']['rounds']} rounds, "
                        f"seed {p['seed']}; audit: {p['audit']['clients']} clients, {p['audit']['public']} public "
                        f"samples, {p['audit']['shadow_models']} shadows x {p['audit']['shadow_epochs']} epochs"),
            "command": "`.venv/bin/dvc repro`, then `.venv/bin/python bench/privacy_docs.py collect`", "rows": rows, "bits_curve": curve,
            "noise_curve": noise_curve(workspace, noise) if noise else [],
            "audit_seconds": round(sum(r["seconds"] or 0 for r in rows), 1)}


def _pm(v: dict | None, digits: int) -> str:
    if v is None:
        return "n/a"
    return f"{v['mean']:.{digits}f} [{v['low']:.{digits}f}, {v['high']:.{digits}f}]" if v.get("low") is not None \
        else f"{v['mean']:.{digits}f}"


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:.1f}"


def _maua(row: dict) -> str:
    if row.get("maua") is None:
        return "n/a"
    low, high = row.get("maua_low"), row.get("maua_high")
    return f"{row['maua']:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None else "")


def _vs_off(d: dict | None) -> str:
    return "n/a" if d is None else f"{d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] {d['verdict']}"


def section(results: list[dict]) -> str:
    """Each CPU's privacy table, the audit's time, and FedCache's bits curve."""
    parts = []
    for r in results:
        parts += [f"### {r['cpu']}, {r['date']}", "", f"Setting: {r['setting']}. Made by {r['command']}.", "",
                  format_privacy(r["rows"]), "",
                  "| run | MAUA [95%] | bytes | audit s | kept for the audit (MB) |", "|---|---|---|---|---|",
                  *[f"| {row['run']} | {_maua(row)} | {row['bytes_total']:,} | {row['seconds']} | "
                    f"{_mb(row.get('kept_bytes'))} |" for row in r["rows"]],
                  "", f"The audit of every method took {r['audit_seconds']} s in all.", ""]
        if r["bits_curve"]:
            parts += ["FedCache's hash bits, a defence: reconstruction from the codes against accuracy (the "
                      "mean public image scores the baseline).", "",
                      "| bits | MAUA [95%] | set-up bytes | PSNR dB [95%] | SSIM [95%] | mean image PSNR |",
                      "|---|---|---|---|---|---|",
                      *[f"| {c['bits']} | {_maua(c)} | {c['bytes_setup']:,} | {_pm(c['psnr'], 1)} | {_pm(c['ssim'], 2)} "
                        f"| {_pm(c['baseline_psnr'], 1)} |" for c in r["bits_curve"]], ""]
        if r.get("noise_curve"):
            parts += [f"FedCache with Gaussian noise on its uploads (`train.dp_noise`, docs/privacy.md; measured "
                      f"{r.get('noise_date', r['date'])}), a defence: "
                      "accuracy, the formal bound (epsilon at delta, per client over the run) and what the audit "
                      "measures. The noise covers the per-round logits, not the set-up's hash codes (reconstruction) "
                      "nor the final models (membership).", "",
                      "| sigma | C | epsilon | MAUA [95%] | MAUA vs no noise (paired by client) | PSNR dB (codes) | "
                      "MIA AUC (loss) | TPR @ 1% FPR | MIA AUC (LiRA) | label-mix TV |",
                      "|---|---|---|---|---|---|---|---|---|---|",
                      *[f"| {c['sigma']:g} | {'n/a' if c['clip'] is None else format(c['clip'], 'g')} | "
                        f"{epsilon_cell(c['dp'])} | {_maua(c)} | {_vs_off(c.get('vs_off'))} | {_pm(c['psnr'], 1)} | "
                        f"{_pm(c['mia_auc'], 2)} | "
                        f"{_pm(c['mia_tpr'], 2)} | {_pm(c['lira_auc'], 2)} | {_pm(c['label_tv'], 2)} |"
                        for c in r["noise_curve"]], ""]
    return "\n".join(parts).strip() or NOT_MEASURED


def render(text: str, results_dir: Path = RESULTS) -> str:
    results = [json.loads(p.read_text()) for p in sorted(results_dir.glob("privacy-*.json"))]
    return replace_section(text, BEGIN, END, f"{BEGIN}\n{section(results)}\n{END}", HEADING)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["collect", "noise"],
                        help="collect a workspace's audits; noise: only FedCache's noise curve, into the existing file")
    parser.add_argument("workspace", nargs="?", type=Path, help="collect: where dvc repro ran")
    parser.add_argument("--bits", action="append", default=[], metavar="BITS=WORKSPACE",
                        help="collect: a workspace of the same params with encode.bits = BITS (FedCache)")
    parser.add_argument("--noise", action="append", default=[], metavar="SIGMA=WORKSPACE",
                        help="collect: a workspace of the same params with train.dp_noise = SIGMA (FedCache)")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/privacy.md is stale")
    args = parser.parse_args(argv)
    if args.command == "noise":
        from roofline import cpu_slug

        out = RESULTS / f"privacy-{cpu_slug()}.json"
        result = json.loads(out.read_text())
        result["noise_curve"] = noise_curve(args.workspace, {float(s): Path(w) for s, w in
                                                             (item.split("=", 1) for item in args.noise)})
        result["noise_date"] = time.strftime("%Y-%m-%d")
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    if args.command == "collect":
        from roofline import cpu_slug

        bits = {int(b): Path(w) for b, w in (item.split("=", 1) for item in args.bits)}
        noise = {float(s): Path(w) for s, w in (item.split("=", 1) for item in args.noise)}
        out = RESULTS / f"privacy-{cpu_slug()}.json"
        result = collect(args.workspace, bits, noise)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
        return 0
    text = DOCS.read_text()
    return write_or_check(DOCS, text, render(text), args.check, "bench/privacy_docs.py")


if __name__ == "__main__":
    sys.exit(main())
