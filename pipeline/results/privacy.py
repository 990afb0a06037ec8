"""The privacy table of the report: each audited run's figures (results/audit/<name>/audit.json, flows/audit.py),
one row a run, each figure with its 95% interval over the audited clients (docs/privacy.md says what they mean)."""

from __future__ import annotations

import json

from pipeline import paths

# each audited run's figures, each {"mean", "low", "high"}: metrics.json's "privacy" and the index's privacy table
METRICS = ("psnr", "ssim", "baseline_psnr", "mia_auc", "mia_tpr", "lira_auc", "label_tv", "uniform_tv")
# a noised run's summary figures (train.dp_noise, pipeline/federation/dp_noise.py): metrics.json's "dp"
NOISE = ("dp_noise", "dp_clip", "dp_delta", "dp_releases", "dp_epsilon")


def noise_of(summary: dict | None) -> dict | None:
    """A run's noise on uploads from its summary.json: the knobs and epsilon at delta (None: the noise was off)."""
    if not summary or summary.get("dp_epsilon") is None:
        return None
    return {k: summary[k] for k in NOISE}


def read_audits(run_names: list[str]) -> dict[str, dict]:
    """run name -> its audit, for the runs that have one (an unaudited run: audit.capture off, or no audit stage)."""
    out = {}
    for name in run_names:
        path = paths.audit_file_of_run(name)
        if path.is_file():
            audit = json.loads(path.read_text())
            if audit.get("captured", True):
                out[name] = audit
    return out


def _iv(mean, low=None, high=None) -> dict | None:
    if mean is None:
        return None
    return {"mean": round(mean, 4), "low": None if low is None else round(low, 4),
            "high": None if high is None else round(high, 4)}


def privacy_row(name: str, audit: dict, summary: dict | None = None) -> dict:
    """One run's figures: reconstruction PSNR / SSIM (and the mean-image baseline), MIA AUC and TPR at 1% FPR (loss
    threshold; LiRA's AUC), label-mix TV (and the uniform guess); None where the attack does not apply. With the run's
    `summary`, "dp": its noise on uploads and epsilon (noise_of; None: off)."""
    rec, mia, mix = audit.get("reconstruction", {}), audit.get("membership", {}), audit.get("label_mix", {})
    row = {"run": name, "method": audit.get("method")}
    for key in ("psnr", "ssim", "baseline_psnr"):
        v = rec.get(key) if rec.get("applies") else None
        row[key] = None if v is None else _iv(v["mean"], v["low"], v["high"])
    loss, lira = mia.get("loss") or {}, mia.get("lira") or {}
    row["mia_auc"] = _iv(loss.get("auc"), loss.get("auc_low"), loss.get("auc_high"))
    row["mia_tpr"] = _iv(loss.get("tpr_at_1pct_fpr"), loss.get("tpr_at_1pct_fpr_low"), loss.get("tpr_at_1pct_fpr_high"))
    row["lira_auc"] = _iv(lira.get("auc"), lira.get("auc_low"), lira.get("auc_high"))
    row["label_tv"] = _iv(mix.get("tv"), mix.get("tv_low"), mix.get("tv_high"))
    row["uniform_tv"] = _iv(mix.get("uniform_tv"), mix.get("uniform_tv_low"), mix.get("uniform_tv_high"))
    row["label_how"] = ", ".join(mix.get("hows", []))
    row["dp"] = noise_of(summary)
    return row


def figures(name: str, audit: dict) -> dict:
    """The audit's figures by metric (METRICS), each {"mean", "low", "high"}: what audit.json keeps for the
    results index's privacy table (pipeline.results.store.audit_figures)."""
    row = privacy_row(name, audit)
    return {m: row[m] for m in METRICS if row.get(m) is not None}


def _cell(v: dict | None, digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if v["low"] is None:
        return f"{v['mean']:.{digits}f}"
    return f"{v['mean']:.{digits}f} [{v['low']:.{digits}f}, {v['high']:.{digits}f}]"


def epsilon_cell(dp: dict | None) -> str:
    """'off', or a noised run's epsilon with its delta and noise multiplier: '37.9 (delta 1e-05, sigma 1)'."""
    if dp is None:
        return "off"
    return f"{dp['dp_epsilon']:.1f} (delta {dp['dp_delta']:g}, sigma {dp['dp_noise']:g})"


def format_privacy(rows: list[dict]) -> str:
    """The privacy table (markdown): what a curious server and a model holder learn, beside accuracy and bytes, and
    the run's formal bound where its uploads were noised (epsilon; 'off': none)."""
    head = ("| run | reconstruction PSNR dB (mean image) | SSIM | MIA AUC (loss) | TPR @ 1% FPR | MIA AUC (LiRA) "
            "| label-mix TV (uniform guess) | labels from | epsilon |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        base = r.get("baseline_psnr")
        psnr = _cell(r["psnr"], 1) + (f" ({base['mean']:.1f})" if base else "")
        tv = _cell(r["label_tv"]) + (f" ({r['uniform_tv']['mean']:.2f})" if r["uniform_tv"] else "")
        lines.append(f"| {r['run']} | {psnr} | {_cell(r['ssim'])} | {_cell(r['mia_auc'])} | {_cell(r['mia_tpr'])} "
                     f"| {_cell(r['lira_auc'])} | {tv} | {r['label_how'] or 'n/a'} | {epsilon_cell(r.get('dp'))} |")
    return "\n".join(lines)
