"""Defaults chosen by running, decided on the validation split (never on test), and docs/choices.md from them.

    .venv/bin/python bench/choices.py list                           # the choices and their candidates
    .venv/bin/python bench/choices.py run fedcache_consistency       # every candidate on seeds 0 1 2
    .venv/bin/python bench/choices.py run pfedme_personal_lr --seeds 0 1 2
    .venv/bin/python bench/choices.py docs                           # docs/choices.md from the result files

`run` prepares bench/.work/choices/<choice>/seed<s>/ per seed (params.yaml with the choice's setting and
the seed; the partition, encode and index stages run there through their CLIs), then trains the method
in-process once per candidate on the same partition, cache and initial weights, and records each run's
validation MAUA and final validation accuracy (the mean over clients of each client's accuracy on its own
validation split: training samples no client trains on). The test split is not read: the runs shrink it
to `partition.test_fraction` 0.05 to save evaluation time. It writes bench/results/choices/<choice>.json
(every run, the machine, the date, the command). The pick: the candidate with the highest mean validation
MAUA over the seeds; every other candidate's paired difference to it (by seed; a t interval over 3 or
more seeds) says whether it is behind or tied, and docs/choices.md says when the pick is only tied.

`docs` writes docs/choices.md from every result file, so the figures there are never typed by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone

from workspace import ROOT, deep_merge, fresh_trainer, load_workspace, prepare_workspace

from pipeline.machine import cpu_description  # noqa: E402  (workspace put the repository on sys.path)

RESULTS = ROOT / "bench" / "results" / "choices"
DOCS = ROOT / "docs" / "choices.md"
VALIDATION_ONLY = {"partition": {"test_fraction": 0.05}}  # the test split is not read: keep its evaluation cheap

# name -> what is chosen, among what, in which setting (a partial params.yaml), and why that setting
CHOICES: dict[str, dict] = {
    "fedcache_consistency": {
        "method": "fedcache", "key": "fedcache.consistency", "candidates": ["live", "step", "round"],
        "default": "step", "setting": {},
        "where": "params.yaml's default (make run's scale: K = 20 x 100 FashionMNIST samples, ResNet-8, 7 rounds)",
        "why": "it is the mode the default make run uses; the paper presets keep the official code's `live` order (the paper's)",
        "tie_break": "among candidates the data cannot separate, `step`: what devices training at the same time see, "
                     "and it runs on the vectorized executor (`live` cannot: one client after another)",
    },
    "pfedme_personal_lr": {
        "method": "pfedme", "key": "pfedme.personal_lr", "candidates": [0.01, 0.03, 0.09],
        "default": 0.01,
        "setting": {"partition": {"samples_per_client": 50},
                    "train": {"model": "resnet20", "fresh_optimizer": True, "rounds": 5, "algorithms": ["pfedme"]}},
        "where": "table5_scaled's protocol (ResNet-20, a fresh optimizer every round) at K = 20 x 50 samples, "
                 "5 rounds (the preset's 30 x 200 x 10 rounds would take hours per seed on 2 cores)",
        "why": "pFedMe runs in the Table 5 presets (its personal learning rate; the official README gives 0.09 for "
               "its MLP and 0.01 for its CNN)",
        "tie_break": "among candidates the data cannot separate, 0.01: the official README's value for its CNN",
    },
    "train_precision": {
        "method": "fedcache", "key": "train.precision", "candidates": ["float32", "bfloat16"],
        "default": "auto", "setting": {},
        "where": "params.yaml's default (make run's scale: K = 20 x 100 FashionMNIST samples, ResNet-8, 7 rounds)",
        "why": "bfloat16 autocast trains faster where the CPU has bfloat16 units (avx512_bf16 or AMX; "
               "docs/executors.md's levers), and may cost accuracy: it is the default only if it ties",
        "tie_break": "among candidates the data cannot separate, the faster on the CPU that runs: bfloat16 with AMX, "
                     "float32 (the reference) elsewhere, where bfloat16 is emulated and several times slower",
        # the default is neither candidate but a rule between them (pipeline/train/precision.py)
        "default_means": "bfloat16 on a CPU with AMX (measured faster there: docs/executors.md's levers), float32 "
                         "elsewhere; it stands only while bfloat16 ties or leads here",
    },
}


# Defaults no run chose: each taken from a source or fixed by design. docs/choices.md lists them with the value
# params.yaml (or the preset) holds today, so a reader sees where every tuned-looking number comes from.
NOT_BY_RUNNING: list[tuple[str, str, str]] = [
    ("params.yaml", "fedcache.beta", "the FedCache paper's section 5.1.4 (beta = 1.5, R = 16)"),
    ("params.yaml", "fedcache.T", "the FedCache official code's KD temperature"),
    ("params.yaml", "index.R", "the FedCache paper's section 5.1.4"),
    ("params.yaml", "train.batch_size", "the FedCache paper's section 5.1.4 (SGD, lr 0.01, batch 8) and its official code"),
    ("params.yaml", "train.lr", "the FedCache paper's section 5.1.4 (momentum 0.9 and weight decay 5e-4: its official code)"),
    ("params.yaml", "pfedme.eta", "the FedCache paper's section 5.1.4 (its pFedMe setting)"),
    ("params.yaml", "pfedme.lambda", "the FedCache paper's section 5.1.4"),
    ("params.yaml", "pfedme.K", "the official pFedMe code"),
    ("params.yaml", "pfedme.mu", "the official pFedMe code (pFedMeOptimizer's mu)"),
    ("params.yaml", "feddkc.beta", "the FedCache paper's section 5.1.4 (the official code's alpha)"),
    ("params.yaml", "fedict.beta", "the FedCache paper's section 5.1.4 (the official code's alpha)"),
    ("params.yaml", "fd.gamma", "a unit weight: no run has compared it against another value"),
    ("params.yaml", "fedproto.lambda", "a unit weight: no run has compared it against another value"),
    ("params.yaml", "train.rounds", "make run's wall-clock budget (at most 10 minutes on 2 cores), never accuracy"),
    ("params.yaml", "partition.samples_per_client", "make run's wall-clock budget, never accuracy"),
    ("presets/stragglers.yaml", "experiments.deadline.train.deadline_quantile",
     "the scenario, by design: the deadline schedule drops the slowest 20% of each round; the schedules are "
     "then compared on equal simulated-time budgets (docs/devices.md), so the quantile is what is compared, "
     "not a knob tuned for accuracy"),
]


def _documented_value(file: str, key: str):
    import yaml

    value = yaml.safe_load((ROOT / file).read_text())
    for part in key.split("."):
        value = value[part]
    return value


def _set(params, key: str, value):
    section, name = key.split(".")
    part = getattr(params, section)
    field = next(f for f, info in type(part).model_fields.items() if (info.alias or f) == name)
    return params.model_copy(update={section: part.model_copy(update={field: value})})


def run(name: str, seeds: list[int]) -> dict:
    """Every candidate on every seed; the result file is written after each run, and a (candidate, seed) it
    already holds for the same setting is not run again (a stopped measurement continues)."""
    choice = CHOICES[name]
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    same = old.get("setting") == choice["setting"] and old.get("candidates") == choice["candidates"]
    runs = [r for r in old.get("runs", []) if same and r["seed"] in seeds]
    result = {"choice": name,
              **{k: choice[k] for k in ("method", "key", "candidates", "default", "where", "why", "tie_break")},
              "setting": choice["setting"], "seeds": seeds, "runs": runs, "cpu": cpu_description(),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "command": f".venv/bin/python bench/choices.py run {name} --seeds {' '.join(map(str, seeds))}"}
    for seed in seeds:
        todo = [v for v in choice["candidates"] if not any(r["seed"] == seed and r["candidate"] == v for r in runs)]
        if not todo:
            continue
        overrides = deep_merge(deep_merge(choice["setting"], VALIDATION_ONLY), {"seed": seed})
        work = prepare_workspace(f"choices/{name}/seed{seed}", overrides, ("partition", "encode", "index"))
        base, part, ds = load_workspace(work)
        for value in todo:
            params = _set(base, choice["key"], value)
            start = time.perf_counter()
            summary = fresh_trainer(params, choice["method"], part, ds, run_name=f"{name}-{value}").run()
            wall = time.perf_counter() - start
            runs.append({"candidate": value, "seed": seed, "val_maua": summary["val_maua"],
                         "val_final_acc": summary["val_final_acc"], "wall_s": round(wall, 1)})
            print(f"seed {seed} {choice['key']}={value}: validation MAUA {summary['val_maua']:.4f}, final "
                  f"{summary['val_final_acc']:.4f} ({wall:.0f} s)", flush=True)
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=1) + "\n")
        os.chdir(ROOT)  # load_workspace changed into the seed's folder; the next seed's is made from the root
    return result


def decide(result: dict) -> tuple[object, list[dict]]:
    """(the picked candidate, one row per candidate: mean validation MAUA and the paired difference to the pick)."""
    from pipeline.results.intervals import covers, percent

    by = {c: {r["seed"]: r for r in result["runs"] if r["candidate"] == c} for c in result["candidates"]}
    seeds = result["seeds"]
    mean = {c: sum(by[c][s]["val_maua"] for s in seeds) / len(seeds) for c in result["candidates"]}
    picked = max(result["candidates"], key=lambda c: mean[c])
    rows = []
    for c in result["candidates"]:
        diffs = [by[c][s]["val_maua"] - by[picked][s]["val_maua"] for s in seeds]
        iv = _t(diffs) if c != picked and len(seeds) >= 3 else None
        rows.append({"candidate": c, "per_seed": [by[c][s]["val_maua"] for s in seeds], "mean": mean[c],
                     "final": sum(by[c][s]["val_final_acc"] for s in seeds) / len(seeds),
                     "diff": None if iv is None else percent(iv, signed=True),
                     "verdict": "highest mean" if c == picked else (iv.verdict if iv else "—"),
                     "covers": covers(len(seeds))})
    return picked, rows


def _t(values: list[float]):
    from pipeline.results.intervals import Interval, t_interval, covers

    low, high = t_interval(values)
    return Interval(sum(values) / len(values), low, high, covers(len(values)))


def docs() -> str:
    """docs/choices.md written from the result files (and returned)."""
    text = render()
    DOCS.write_text(text)
    return text


def render() -> str:
    """docs/choices.md's text from bench/results/choices/*.json, params.yaml and the presets."""
    lines = ["# Defaults chosen by running",
             "",
             "Back to [the docs index](index.md).",
             "",
             "Every default or preset value the project chose by running is decided here on the **validation split** "
             "(each client's training samples that no client trains on, in its label mix: `partition.val_ratio`), "
             "never on test. Each row is the mean over seeds of the validation MAUA (the highest mean validation "
             "accuracy over the rounds); the difference to the candidate with the highest mean is paired by seed, with a t interval "
             "over the seeds; \"tied\" when it contains 0. Generated by `.venv/bin/python bench/choices.py docs` from "
             "`bench/results/choices/*.json`; each section names the command that measured it.",
             ""]
    files = sorted(RESULTS.glob("*.json"))
    if not files:
        lines.append("No choice has been measured yet.")
    for path in files:
        result = json.loads(path.read_text())
        picked, rows = decide(result)
        lines += [f"## `{result['key']}`", "",
                  f"Why it is a choice: {result['why']}. Setting: {result['where']}. Seeds {result['seeds']}; "
                  f"{result['date']}, {result['cpu']}; `{result['command']}`.", "",
                  "| candidate | validation MAUA per seed | mean | final validation acc (mean) | "
                  "difference to the highest mean, points [95% CI] | |", "|---|---|---|---|---|---|"]
        for r in rows:
            per_seed = ", ".join(f"{v:.4f}" for v in r["per_seed"])
            lines.append(f"| {r['candidate']} | {per_seed} | {r['mean']:.4f} | {r['final']:.4f} | "
                         f"{r['diff'] or '—'} | {r['verdict']} |")
        tied = [r["candidate"] for r in rows if r["verdict"] == "tied"]
        choice = CHOICES.get(result["choice"], result)
        default = choice["default"]
        lines += ["", f"Highest mean validation MAUA: {picked}"
                  + (f", tied with {', '.join(map(str, tied))}: the data cannot separate them. Among such candidates the "
                     f"default is {choice['tie_break'].removeprefix('among candidates the data cannot separate, ')}"
                     if tied else "") + ".",
                  "", f"Default: **{default}**"
                  + (f": {choice['default_means']}" if "default_means" in choice and
                     all(r["verdict"] != "behind" for r in rows)
                     else " (the highest mean)" if default == picked else " (tied with the highest mean)" if default in tied
                     else ": **behind the highest mean; this measurement says change it**") + ".", ""]
    lines += ["## Defaults no run chose", "",
              "Every other number that looks tuned was taken from a source or fixed by design; none was picked by "
              "comparing accuracies (on test or validation). The value is read from the file today.", "",
              "| key | value | file | where it comes from |", "|---|---|---|---|"]
    for file, key, source in NOT_BY_RUNNING:
        lines.append(f"| `{key}` | {_documented_value(file, key)} | {file} | {source} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    r = sub.add_parser("run")
    r.add_argument("name", choices=sorted(CHOICES))
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    sub.add_parser("docs")
    args = ap.parse_args()
    if args.command == "list":
        for name, c in CHOICES.items():
            print(f"{name:24s} {c['key']}: {c['candidates']} (default {c['default']})")
    elif args.command == "run":
        run(args.name, args.seeds)
    else:
        print(docs())
    return 0


if __name__ == "__main__":
    sys.exit(main())
