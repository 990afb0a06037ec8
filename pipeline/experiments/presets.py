"""Presets: named sets of params.yaml overrides (presets/<name>.yaml), run as DVC experiments.

A preset file is a partial params.yaml: only the keys it changes, nested the same way. It is
checked against the project's params.yaml (merged, then validated like any params file), and
turned into DVC's `-S key=value` flags, so a preset runs as `dvc exp run -S ...`: params.yaml's
comments and the default run stay as they are, and DVC records the experiment with its params.

    python -m pipeline.experiments.presets list                      # the presets and their first comment line
    python -m pipeline.experiments.presets show fedcache_paper       # its -S flags and the command that runs it
    python -m pipeline.experiments.presets run fedcache_paper        # dvc exp run with those flags
    python -m pipeline.experiments.presets run fedcache_paper -S train.rounds=100   # later -S flags win
    python -m pipeline.experiments.presets table stragglers --target 0.65   # a preset of experiments: its table again

Extra `-S` flags and `--queue` (queue instead of running now) pass through to `dvc exp run`.

A preset that compares settings one pipeline cannot hold at once (one method under two schedules: each
training stage has one output, results/runs/<method>) lists them under `experiments:`, each a partial
params.yaml applied after the preset's other keys (presets/stragglers.yaml). `run` then queues one DVC
experiment per entry, named <preset>-<entry>, and runs the queue (`--jobs` at a time) as a sweep does
(pipeline/experiments/sweeps.py: each experiment's runs are published to results/experiments/<name>/ and
the results index); it ends by printing one comparison table over every experiment's runs, which a
run's label (its schedule, its knobs) tells apart.

A preset may also list `seeds:` (e.g. `seeds: [0, 1, 2]`, presets/compare.yaml): every experiment then
runs once per root seed, as <preset>[-<entry>]-s<seed>, and the table gives each method over its seeds with
95% intervals and the paired differences against local-only and FedCache (pipeline.results.compare).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.config import ConfigError, load_params, parse_params
from pipeline.experiments.overrides import apply, dvc_program, first_comment, flag_value, flags  # noqa: F401 (presets.apply, ...)

PRESETS_DIR = Path("presets")


def preset_path(name: str, presets_dir: Path = PRESETS_DIR) -> Path:
    path = Path(presets_dir) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available(presets_dir)) or "none"
        raise ConfigError(f"no preset {name!r}: {path} does not exist (presets: {known})")
    return path


def available(presets_dir: Path = PRESETS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(presets_dir).glob("*.yaml"))


EXPERIMENTS = "experiments"  # a preset's key for several experiments (module doc); not a params.yaml section
SEEDS = "seeds"  # a preset's key: run every experiment on each of these root seeds (module doc)
EXPERIMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # a part of a DVC experiment's name (a git ref)


def _read(path: Path) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: expected a mapping of params.yaml keys to change")
    return raw


def experiments(path: Path) -> dict[str, dict[str, object]]:
    """The preset's `experiments:` as {entry: {"section.key": value}}; {} for a preset without it."""
    section = _read(path).get(EXPERIMENTS)
    if section is None:
        return {}
    if not isinstance(section, dict) or not section:
        raise ConfigError(f"{path}: {EXPERIMENTS}: expected a mapping of names to partial params.yaml, e.g. "
                          f"{EXPERIMENTS}: {{sync: {{train: {{schedule: sync}}}}}}")
    out = {}
    for entry, body in section.items():
        if not isinstance(entry, str) or not EXPERIMENT_NAME.fullmatch(entry):
            raise ConfigError(f"{path}: {EXPERIMENTS}.{entry}: a name of letters, digits, _ and - (it names a DVC "
                              f"experiment)")
        if not isinstance(body, dict) or not body:
            raise ConfigError(f"{path}: {EXPERIMENTS}.{entry}: expected a mapping of params.yaml keys to change")
        out[entry] = _flat(body)
    return out


def seeds(path: Path) -> list[int]:
    """The preset's `seeds:` (root seeds to run every experiment on); [] for a preset without it."""
    value = _read(path).get(SEEDS)
    if value is None:
        return []
    if (not isinstance(value, list) or not value or any(type(v) is not int or v < 0 for v in value)
            or len(set(value)) != len(value)):
        raise ConfigError(f"{path}: {SEEDS}: expected a list of distinct non-negative integers, e.g. {SEEDS}: [0, 1, 2]")
    return value


def overrides(path: Path) -> dict[str, object]:
    """The preset's keys as {"section.key": value}, in file order (`experiments:` and `seeds:` left out: see
    experiments and seeds)."""
    raw = _read(path)
    common = {k: v for k, v in raw.items() if k not in (EXPERIMENTS, SEEDS)}
    if not common and EXPERIMENTS not in raw and SEEDS not in raw:
        raise ConfigError(f"{path}: expected a mapping of params.yaml keys to change")
    return _flat(common)


def several(path: Path) -> bool:
    """Whether the preset runs as several queued experiments (`experiments:` or `seeds:`)."""
    return bool(experiments(path) or seeds(path))


def _flat(raw: dict) -> dict[str, object]:
    flat: dict[str, object] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                walk(value, f"{dotted}.")
            else:
                flat[dotted] = value

    walk(raw, "")
    return flat


def check(name: str, params_file: Path = Path("params.yaml"), presets_dir: Path = PRESETS_DIR) -> dict[str, object]:
    """The preset's overrides, after checking that params.yaml with them applied is valid (and, for a preset
    with `experiments:`, with each experiment's applied too: plan)."""
    path = preset_path(name, presets_dir)
    flat = overrides(path)
    load_params(params_file)  # params.yaml itself first: its own errors name it
    base = yaml.safe_load(Path(params_file).read_text())
    parse_params(apply(base, flat, str(path)), f"{params_file} with preset {path}")
    if several(path):
        plan(name, [], params_file, presets_dir)
    return flat


def plan(name: str, extra: list[str] = (), params_file: Path = Path("params.yaml"),
         presets_dir: Path = PRESETS_DIR) -> list:
    """A preset with `experiments:` or `seeds:`: one sweeps.Planned per entry and seed, named <preset>-<entry>
    (<preset>-<entry>-s<seed> with seeds; <preset>-s<seed> for seeds alone), its settings the preset's keys,
    then the entry's, then the seed, then `extra` (-S key=value), each checked against params.yaml."""
    from pipeline.experiments.sweeps import Planned, parse_extra

    path = preset_path(name, presets_dir)
    common, entries, roots = overrides(path), experiments(path), seeds(path)
    if not entries and not roots:
        raise ConfigError(f"{path}: no `{EXPERIMENTS}:` or `{SEEDS}:` section (a preset without them runs as one "
                          "experiment)")
    load_params(params_file)
    base = yaml.safe_load(Path(params_file).read_text())
    out = []
    for entry, own in (entries or {"": {}}).items():
        for seed in roots or [None]:
            settings = {**common, **own, **({} if seed is None else {"seed": seed}), **parse_extra(list(extra))}
            exp = "-".join(part for part in (name, entry, None if seed is None else f"s{seed}") if part)
            parse_params(apply(base, settings, f"{path} ({EXPERIMENTS}.{entry})" if entry else str(path)),
                         f"{params_file} with preset {path}, experiment {exp.removeprefix(f'{name}-')}")
            out.append(Planned(exp, "experiment", exp.removeprefix(f"{name}-"), settings))
    return out


def published_table(planned: list, params_file: Path = Path("params.yaml"), target: float | None = None) -> str:
    """One comparison table (pipeline.results.report.format_table) over the runs every planned experiment
    published to results/experiments/<name>/; each run is named by its label (its schedule included).
    target: the accuracy for bytes and time to target (None: the preset's report.target_acc for its dataset)."""
    from pipeline.experiments.dvc import EXPERIMENTS as PUBLISHED
    from pipeline.results.compare import budget_rows, comparison, differences, method_rows
    from pipeline.results.compression import compression_rows, encodings, format_compression, goal_lines
    from pipeline.results.report import format_budget, format_differences, format_methods, format_table, verdict_line
    from pipeline.results.store import ResultsDB

    base = yaml.safe_load(Path(params_file).read_text())
    series = []
    for exp in planned:
        for summary in sorted((PUBLISHED / exp.name).glob("*/summary.json")):
            run_id = json.loads(summary.read_text())["run_id"]
            series += ResultsDB(summary.parent / "run.duckdb").series([run_id])
    if not series:
        return "no published runs"
    params = parse_params(apply(base, planned[0].settings, "preset"))
    target = params.report.target_acc.get(params.data.dataset) if target is None else target
    diffs, budget = differences(series), budget_rows(series, target)  # budget: timed runs on one grid
    tail = f"\n\n{verdict_line(diffs)}\n\n{format_differences(diffs)}" if diffs else ""
    tail += f"\n\n{format_budget(budget)}" if budget else ""
    if any(encodings(s.name) for s in series):  # encoded payloads: each against its own method in float32
        rows = compression_rows(series, target)
        tail += "\n\nEncodings against float32:\n\n" + format_compression(rows) + "\n\n" + "\n".join(goal_lines(rows))
    if len({s.seed for s in series}) > 1:  # several seeds: each method over its seeds, then the paired differences
        return f"{format_methods(method_rows(series))}{tail}"
    return f"{format_table(comparison(series, target, baseline=params.report.baseline))}{tail}"


def write_table(path: Path, name: str, table: str, target: float | None = None) -> None:
    """A preset's published table as a Markdown page: what produced it (the command, when, on which CPU), then the
    table, so that a page of figures is always generated from the result files, never typed."""
    from datetime import datetime, timezone

    from pipeline.machine import cpu_description

    command = shlex.join(["python", "-m", "pipeline.experiments.presets", "table", name,
                          *(["--target", str(target)] if target is not None else []), "--write", str(path)])
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path.write_text(f"# The `{name}` preset's table\n\nBack to [the docs index](index.md).\n\nGenerated {stamp} on "
                    f"{cpu_description()} by `{command}` from the runs the preset's experiments published "
                    f"(`results/experiments/{name}-*/`); preset: `presets/{name}.yaml`.\n\n{table}\n")


def dvc_command(name: str, extra: list[str], queue: bool = False, params_file: Path = Path("params.yaml"),
                presets_dir: Path = PRESETS_DIR) -> list[str]:
    cmd = [dvc_program(), "exp", "run"]
    if queue:
        cmd.append("--queue")
    for flag in flags(check(name, params_file, presets_dir)) + extra:
        cmd += ["-S", flag]
    return cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.experiments.presets", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the presets")
    show = sub.add_parser("show", help="a preset's -S flags and the command that runs it")
    show.add_argument("name")
    run = sub.add_parser("run", help="dvc exp run with the preset's -S flags")
    run.add_argument("name")
    run.add_argument("-S", "--set-param", dest="extra", action="append", default=[],
                     help="one more key=value after the preset's (wins over it)")
    run.add_argument("--queue", action="store_true", help="queue the experiment (dvc exp run --queue)")
    run.add_argument("--jobs", type=int, default=1,
                     help=f"a preset with `{EXPERIMENTS}:`: experiments at once (default: 1)")
    table = sub.add_parser("table", help=f"a preset with `{EXPERIMENTS}:`: the comparison over its published runs again")
    table.add_argument("name")
    table.add_argument("--target", type=float, help="the target accuracy (default: the preset's report.target_acc)")
    table.add_argument("--write", metavar="PATH", help="also write the table to this Markdown file, headed by the "
                       "command, the date and the CPU (docs/comparison.md is made so)")
    args = ap.parse_args(argv)
    try:
        if args.command == "list":
            for name in available():
                print(f"{name:28s} {first_comment(preset_path(name))}")
            return 0
        if args.command == "table":
            if args.target is not None and not 0 < args.target <= 1:
                raise ConfigError(f"--target {args.target}: expected a mean accuracy in (0, 1], e.g. --target 0.65")
            text = published_table(plan(args.name), target=args.target)
            print(text)
            if args.write:
                write_table(Path(args.write), args.name, text, args.target)
            return 0
        if args.command in ("show", "run") and several(preset_path(args.name)):
            return _several(args)
        if args.command == "show":
            print("\n".join(flags(check(args.name))))
            print("\n" + shlex.join(dvc_command(args.name, [])))
            return 0
        cmd = dvc_command(args.name, args.extra, args.queue)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(shlex.join(cmd), flush=True)
    return subprocess.call(cmd)


def _several(args: argparse.Namespace) -> int:
    """show / run of a preset with `experiments:` (queued DVC experiments, as a sweep)."""
    from pipeline.experiments.sweeps import run_planned, show_planned

    if args.command == "show":
        show_planned(plan(args.name))
        return 0
    planned = plan(args.name, args.extra)
    code = run_planned(planned, args.jobs)
    print(f"\nEvery experiment of preset {args.name}:\n{published_table(planned)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
