"""Sweeps: DVC experiments that change one params.yaml key at a time, queued and run in parallel.

    python -m pipeline.experiments.sweeps list                       # the sweeps and their first comment line
    python -m pipeline.experiments.sweeps show ablation_R           # its experiments and their -S flags
    python -m pipeline.experiments.sweeps run ablation_R            # queue them, run 2 at a time, collect
    python -m pipeline.experiments.sweeps run ablation_R --jobs 1 -S train.rounds=20   # later -S flags win

A sweep file, sweeps/<name>.yaml, has `set` (a partial params.yaml applied to every experiment)
and `vary` ({dotted key: [values]}): one experiment per value, every other key as params.yaml
(with `set`) has it, named <sweep>-<key>-<value>. `run` checks every experiment's params first
(an error names the file and key), removes an earlier experiment of the same name (`dvc exp
remove`), queues them (`dvc exp run --queue -n NAME -S ...`; not `--force`, which would also rerun
every unchanged stage), runs the queue with `dvc exp run --run-all --jobs N`, and prints
what each experiment's report stage published into this checkout (pipeline.experiments.dvc): its
runs are in results/results.duckdb, tagged with the experiment's name and the params it changed,
for the dashboard to show side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeline import paths
from pipeline.config import ConfigError, load_params, parse_params
from pipeline.experiments.dvc import EXPERIMENTS, flatten
from pipeline.experiments.overrides import apply, dvc_program, first_comment, flag_value, flags

SWEEPS_DIR = Path("sweeps")


@dataclass(frozen=True)
class Planned:
    name: str
    key: str
    value: object
    settings: dict[str, object]  # every -S of the experiment, as {dotted key: value}

    @property
    def changed(self) -> str:
        return f"{self.key}={flag_value(self.value)}"


def sweep_path(name: str, sweeps_dir: Path = SWEEPS_DIR) -> Path:
    path = Path(sweeps_dir) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in Path(sweeps_dir).glob("*.yaml"))) or "none"
        raise ConfigError(f"no sweep {name!r}: {path} does not exist (sweeps: {known})")
    return path


def experiment_name(sweep: str, key: str, value: object) -> str:
    """<sweep>-<last part of key>-<value>, with only the characters a git ref name takes."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{sweep}-{key.split('.')[-1]}-{flag_value(value)}").strip("._")


def parse_extra(extra: list[str]) -> dict[str, object]:
    out = {}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"-S {item!r}: expected key=value, e.g. -S train.rounds=20")
        out[key] = yaml.safe_load(value)  # as DVC reads it
    return out


def plan(name: str, extra: list[str] = (), params_file: Path = Path("params.yaml"),
         sweeps_dir: Path = SWEEPS_DIR) -> list[Planned]:
    """The sweep's experiments, each checked against params.yaml (ConfigError naming file and key)."""
    path = sweep_path(name, sweeps_dir)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict) or set(raw) - {"set", "vary"} or not isinstance(raw.get("vary"), dict) \
            or not raw["vary"]:
        raise ConfigError(f"{path}: expected `vary: {{key: [values]}}` and optionally `set: {{...}}` (found "
                          f"{sorted(raw) if isinstance(raw, dict) else type(raw).__name__})")
    common = overrides_of(raw.get("set") or {}, path)
    load_params(params_file)  # params.yaml's own errors name it
    base = yaml.safe_load(Path(params_file).read_text())
    out = []
    for key, values in raw["vary"].items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: vary.{key}: expected a list of values, e.g. [1, 4, 16]")
        for value in values:
            settings = {**common, key: value, **parse_extra(list(extra))}
            exp = experiment_name(name, key, value)
            parse_params(apply(base, settings, str(path)), f"{params_file} with sweep {path}, experiment {exp}")
            out.append(Planned(exp, key, value, settings))
    return out


def overrides_of(section: object, path: Path) -> dict[str, object]:
    """The `set` section (a partial params.yaml, as a preset) as {dotted key: value}."""
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: set: expected a mapping of params.yaml keys")
    return flatten(section)


def dvc_env() -> dict[str, str]:
    """This environment with the interpreter's bin/ first on PATH: DVC's queue starts its workers
    as `dvc ...` by name, which a plain shell (venv not active) would not find."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def queue_command(exp: Planned) -> list[str]:
    cmd = [dvc_program(), "exp", "run", "--queue", "-n", exp.name]
    for flag in flags(exp.settings):
        cmd += ["-S", flag]
    return cmd


def collect(planned: list[Planned]) -> list[dict]:
    """Each experiment's published runs (results/experiments/<name>/*/summary.json), in plan order."""
    rows = []
    for exp in planned:
        folder = EXPERIMENTS / exp.name
        summaries = sorted(folder.glob("*/summary.json"))
        if not summaries:
            rows.append({"experiment": exp.name, "changed": exp.changed, "run": None})
        for path in summaries:
            s = json.loads(path.read_text())
            rows.append({"experiment": exp.name, "changed": exp.changed, "run": path.parent.name,
                         "maua": s.get("maua"), "bytes_total": s.get("bytes_total"), "interval": _interval(path, s)})
    return rows


def _interval(summary: Path, s: dict):
    """The run's MAUA with its 95% interval over clients (pipeline.results.intervals), from its results file
    beside summary.json; None for a run from before per-client rows."""
    from pipeline.results.store import ResultsDB

    results = summary.parent / paths.RUN_RESULTS
    if not results.is_file() or "run_id" not in s:
        return None
    (series,) = ResultsDB(results).series([s["run_id"]])
    acc = series.accuracies()
    if acc is None:
        return None
    from pipeline.results.intervals import run_interval

    return run_interval([acc], "maua")


def format_rows(rows: list[dict]) -> str:
    """One row per published run: its MAUA with the 95% interval over its clients (one seed: it does not cover
    the seed; compare values by a paired difference, not by overlap) and its bytes."""
    from pipeline.results.intervals import percent

    lines = ["| experiment | changed | run | MAUA [95% CI, over clients] | bytes |", "|---|---|---|---|---|"]
    for r in rows:
        if r["run"] is None:
            lines.append(f"| {r['experiment']} | {r['changed']} | not published (see `dvc queue logs "
                         f"{r['experiment']}`) | | |")
        else:
            maua = percent(r["interval"]) if r.get("interval") is not None else f"{r['maua']:.4f}"
            lines.append(f"| {r['experiment']} | {r['changed']} | {r['run']} | {maua} | {r['bytes_total']:,} |")
    return "\n".join(lines)


def run(name: str, extra: list[str], jobs: int) -> int:
    return run_planned(plan(name, extra), jobs)


def show_planned(planned: list[Planned]) -> None:
    """Print the command that queues each planned experiment (a sweep's or a preset's `show`)."""
    for exp in planned:
        print(shlex.join(queue_command(exp)))


def run_planned(planned: list[Planned], jobs: int) -> int:
    """Queue the planned experiments (an earlier one of the same name removed first), run the queue `jobs` at a
    time, rebuild the index and print what each published; also runs a preset's experiments (presets.py)."""
    from pipeline.results.store import rebuild_index

    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: expected at least 1")
    listed = subprocess.run([dvc_program(), "exp", "list", "--name-only"], env=dvc_env(), capture_output=True,
                            text=True)
    if listed.returncode != 0:
        print(f"error: could not list this commit's DVC experiments (dvc exp list): {listed.stderr.strip()}",
              file=sys.stderr)
        return 1
    earlier = [exp.name for exp in planned if exp.name in listed.stdout.split()]  # experiments of the same names
    if earlier:
        print(shlex.join(cmd := [dvc_program(), "exp", "remove", *earlier]), flush=True)
        if subprocess.call(cmd, env=dvc_env()) != 0:
            print(f"error: could not remove the earlier experiment(s) {', '.join(earlier)}", file=sys.stderr)
            return 1
    for exp in planned:
        shutil.rmtree(EXPERIMENTS / exp.name, ignore_errors=True)  # an earlier run's copies of this experiment
        cmd = queue_command(exp)
        print(shlex.join(cmd), flush=True)
        if subprocess.call(cmd, env=dvc_env()) != 0:
            print(f"error: could not queue experiment {exp.name}", file=sys.stderr)
            return 1
    cmd = [dvc_program(), "exp", "run", "--run-all", "--jobs", str(jobs)]
    print(shlex.join(cmd), flush=True)
    code = subprocess.call(cmd, env=dvc_env())
    print(rebuild_index(paths.RESULTS_DB, report_csv=paths.REPORT_DIR / "comparison.csv").message)
    rows = collect(planned)
    print(format_rows(rows))
    missing = [r["experiment"] for r in rows if r["run"] is None]
    if missing:
        print(f"error: {len(missing)} experiment(s) published no results: {', '.join(missing)}", file=sys.stderr)
    return 1 if code != 0 or missing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.experiments.sweeps", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the sweeps")
    show = sub.add_parser("show", help="a sweep's experiments and the commands that queue them")
    show.add_argument("name")
    go = sub.add_parser("run", help="queue the sweep's experiments, run them, collect their results")
    go.add_argument("name")
    go.add_argument("-S", "--set-param", dest="extra", action="append", default=[],
                    help="one more key=value for every experiment (wins over the sweep's)")
    go.add_argument("--jobs", type=int, default=2, help="experiments at once (default: 2)")
    args = ap.parse_args(argv)
    try:
        if args.command == "list":
            for path in sorted(SWEEPS_DIR.glob("*.yaml")):
                print(f"{path.stem:28s} {first_comment(path)}")
            return 0
        if args.command == "show":
            show_planned(plan(args.name))
            return 0
        return run(args.name, args.extra, args.jobs)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
