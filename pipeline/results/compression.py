"""The bytes-accuracy plane of payload encodings (issue 38): each method at each encoding against itself in float32.

An encoding is a knob of its method's params section (`fedcache.encode_up`, `fedavg.encode_down`, ...), so a run's
label names it ("fedcache (consistency=round, encode_up=int8, encode_down=int8)", pipeline.results.labels) and the
same label without its encode_* knobs names the run it is measured against: the same method, same knobs, float32
("fedcache (consistency=round)"). Per method and encoding, over its seeds:

- MAUA with its 95% interval (pipeline.results.intervals: a t interval over 3 or more seeds);
- bytes, with and without the one-time set-up, and their ratio to the float32 twin's;
- the paired difference in MAUA to the float32 twin (by client within a seed, by seed across seeds) and the word
  that follows its interval ("tied" when it contains 0);
- the speed-up at equal accuracy against FedAvg in float32 (the paper's figure): in each seed, FedAvg's bytes to
  reach the level (the target accuracy, or FedAvg's own MAUA when it never reaches the target) over this run's bytes
  to reach it; the mean over the seeds where the run reaches it, and in how many of those with a FedAvg run it
  does ("not reached" in none).

Pure functions over RunSeries (pipeline.results.compare), shared by the preset table and docs/compression.md's
generator (bench/compression.py).
"""

from __future__ import annotations

import re

import numpy as np

from pipeline.results.compare import Group, RunSeries, groups
from pipeline.results.intervals import paired_difference, run_interval

_ENCODE_KNOB = re.compile(r"^encode_(\w+)=(.+)$")
PARAMETER_SHARING = "fedavg"  # the reference of the speed-up at equal accuracy (report.baseline's default)


def _split(label: str) -> tuple[str, list[str]]:
    """"fedcache (a=1, b=2)" -> ("fedcache", ["a=1", "b=2"]). A knob's value has no ", " (labels.py writes JSON
    without spaces), so the split is exact."""
    name, _, rest = label.partition(" (")
    return name, (rest[:-1].split(", ") if rest else [])


def encodings(label: str) -> dict[str, str]:
    """The run's encodings by knob ("up", "down", "models", ...); empty: everything travels as float32."""
    return {m[1]: m[2] for knob in _split(label)[1] if (m := _ENCODE_KNOB.match(knob))}


def encoding_text(label: str) -> str:
    """How a person reads a run's encoding: "float32", "int8" (every direction), or "up int8, down float16"."""
    found = encodings(label)
    values = set(found.values())
    if not found or values == {"float32"}:
        return "float32"
    if len(values) == 1:
        return values.pop()
    return ", ".join(f"{where} {spec}" for where, spec in found.items())


def float32_twin(label: str) -> str:
    """The label of the same run in float32: its encode_* knobs left out."""
    name, knobs = _split(label)
    rest = [k for k in knobs if not _ENCODE_KNOB.match(k)]
    return f"{name} ({', '.join(rest)})" if rest else name


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _speedups(g: Group, fedavg: Group | None, target: float | None, include_setup: bool
              ) -> tuple[float | None, int, int]:
    """(mean over seeds of FedAvg's bytes to the level / g's bytes to it, seeds where g reaches it, seeds with a
    FedAvg run to measure against): module doc. A method that sends nothing has no speed-up (0 seeds tried)."""
    if fedavg is None or target is None:
        return None, 0, 0
    ratios, tried = [], 0
    for seed, run in g.runs.items():
        ref = fedavg.runs.get(seed)
        if ref is None or ref.maua is None or run.total_bytes == 0:
            continue
        tried += 1
        level = min(target, ref.maua)
        theirs, ours = ref.bytes_to_target(level, include_setup), run.bytes_to_target(level, include_setup)
        if theirs and ours:
            ratios.append(theirs / ours)
    return _mean(ratios), len(ratios), tried


def compression_rows(series: list[RunSeries], target: float | None = None) -> list[dict]:
    """One row per method and encoding (module doc), in first-seen order; None where a figure does not apply
    (no float32 twin among the runs, no seed in common, no FedAvg)."""
    gs = groups(series)
    by_name = {(g.name, g.setting): g for g in gs}
    rows = []
    for g in gs:
        seeds = [k for k, r in g.runs.items() if r.accuracies() is not None]
        if not seeds:
            continue
        runs = [g.runs[k] for k in seeds]
        maua = run_interval([r.accuracies() for r in runs], "maua")
        fedavg = by_name.get((PARAMETER_SHARING, g.setting))
        twin = by_name.get((float32_twin(g.name), g.setting))
        row = {"label": g.name, "algorithm": g.algorithm, "setting": g.setting, "encoding": encoding_text(g.name),
               "seeds": len(seeds), "maua": maua.estimate, "maua_low": maua.low, "maua_high": maua.high,
               "covers": maua.covers,
               "bytes_total": _mean([r.total_bytes for r in runs]),
               "bytes_training": _mean([r.total_bytes - r.setup_bytes for r in runs]),
               "vs": twin.name if twin is not None else None, "bytes_ratio": None, "bytes_ratio_training": None,
               "diff": None, "diff_low": None, "diff_high": None, "verdict": None}
        if twin is not None:
            twin_runs = list(twin.runs.values())
            total, training = (_mean([r.total_bytes for r in twin_runs]),
                               _mean([r.total_bytes - r.setup_bytes for r in twin_runs]))
            row["bytes_ratio"] = row["bytes_total"] / total if total else None  # local-only sends nothing
            row["bytes_ratio_training"] = row["bytes_training"] / training if training else None
            common = [k for k in seeds if k in twin.runs and twin.runs[k].accuracies() is not None]
            if twin is not g and common:
                iv = paired_difference([g.runs[k].accuracies() for k in common],
                                       [twin.runs[k].accuracies() for k in common], "maua")
                row.update(diff=iv.estimate, diff_low=iv.low, diff_high=iv.high, verdict=iv.verdict)
        for key, setup in (("speedup", True), ("speedup_no_setup", False)):
            row[key], row[f"{key}_seeds"], row[f"{key}_tried"] = _speedups(g, fedavg, target, setup)
        rows.append(row)
    return rows


def _points(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def _mb(n: float | None) -> str:
    return "—" if n is None else f"{n / 1e6:.3g} MB"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def format_compression(rows: list[dict]) -> str:
    """The rows as a Markdown table (percent points; bytes in MB; ratios to the float32 twin's bytes)."""
    lines = ["| method | encoding | seeds | MAUA % [95%] | bytes (with set-up) | bytes (training) | bytes / float32 "
             "| MAUA − float32's, points [95%] | | speed-up vs FedAvg at equal accuracy (seeds reaching it) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        diff = ("—" if r["diff"] is None else
                f"{_points(r['diff'], True)} [{_points(r['diff_low'], True)}, {_points(r['diff_high'], True)}]")
        speedup = ("—" if not r["speedup_tried"] else f"not reached (0 of {r['speedup_tried']})"
                   if r["speedup"] is None else f"{r['speedup']:.3g}x ({r['speedup_seeds']} of {r['speedup_tried']})")
        lines.append(f"| {r['algorithm']} | {r['encoding']} | {r['seeds']} | {_points(r['maua'])} "
                     f"[{_points(r['maua_low'])}, {_points(r['maua_high'])}] | {_mb(r['bytes_total'])} "
                     f"| {_mb(r['bytes_training'])} | {_ratio(r['bytes_ratio'])} | {diff} | {r['verdict'] or ''} "
                     f"| {speedup} |")
    return "\n".join(lines)


def goal_lines(rows: list[dict], method: str = "fedcache") -> list[str]:
    """Issue 38's goal for `method`, read off the rows: the encodings at most a quarter of float32's bytes that
    are tied with float32, and the smallest encoding's difference (within 1 point of float32's MAUA or not)."""
    mine = [r for r in rows if r["algorithm"] == method and r["bytes_ratio"] is not None]
    encoded = [r for r in mine if r["encoding"] != "float32" and r["diff"] is not None]
    if not encoded:
        return [f"No encoded {method} run with a float32 twin among the results."]
    quarter = [r for r in encoded if r["bytes_ratio"] <= 0.25]
    tied = [r for r in quarter if r["verdict"] == "tied"]
    lines = [f"{method}: {len(quarter)} encoding(s) at most 1/4 of float32's bytes; tied with float32 (the paired "
             f"interval contains 0): {', '.join(r['encoding'] for r in tied) or 'none'}; "
             f"{'; '.join(r['encoding'] + ' ' + r['verdict'] for r in quarter if r not in tied) or 'none behind'}."]
    smallest = min(encoded, key=lambda r: r["bytes_total"])
    within = smallest["diff"] >= -0.01
    lines.append(f"{method}'s smallest encoding, {smallest['encoding']} ({_ratio(smallest['bytes_ratio'])} of "
                 f"float32's bytes): MAUA {_points(smallest['diff'], True)} points "
                 f"[{_points(smallest['diff_low'], True)}, {_points(smallest['diff_high'], True)}] against float32, "
                 f"{'within' if within else 'more than'} 1 point (the estimate).")
    return lines
