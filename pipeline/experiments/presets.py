"""Presets: named sets of params.yaml overrides (presets/<name>.yaml), run as DVC experiments.

A preset file is a partial params.yaml: only the keys it changes, nested the same way. It is
checked against the project's params.yaml (merged, then validated like any params file), and
turned into DVC's `-S key=value` flags, so a preset runs as `dvc exp run -S ...`: params.yaml's
comments and the default run stay as they are, and DVC records the experiment with its params.

    python -m pipeline.experiments.presets list                      # the presets and their first comment line
    python -m pipeline.experiments.presets show fedcache_paper       # its -S flags and the command that runs it
    python -m pipeline.experiments.presets run fedcache_paper        # dvc exp run with those flags
    python -m pipeline.experiments.presets run fedcache_paper -S train.rounds=100   # later -S flags win

Extra `-S` flags and `--queue` (queue instead of running now) pass through to `dvc exp run`.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.config import ConfigError, load_params, parse_params

PRESETS_DIR = Path("presets")
SIMPLE = re.compile(r"[A-Za-z0-9_./:+-]+")  # a string DVC's -S (Hydra's grammar) reads without quotes


def preset_path(name: str, presets_dir: Path = PRESETS_DIR) -> Path:
    path = Path(presets_dir) / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(available(presets_dir)) or "none"
        raise ConfigError(f"no preset {name!r}: {path} does not exist (presets: {known})")
    return path


def available(presets_dir: Path = PRESETS_DIR) -> list[str]:
    return sorted(p.stem for p in Path(presets_dir).glob("*.yaml"))


def overrides(path: Path) -> dict[str, object]:
    """The preset's keys as {"section.key": value}, in file order."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{path}: expected a mapping of params.yaml keys to change")
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


def apply(base: dict, flat: dict[str, object], source: str) -> dict:
    """A copy of the params mapping `base` with the dotted keys set (as `dvc exp run -S` does)."""
    out = yaml.safe_load(yaml.safe_dump(base))
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for i, part in enumerate(parents):
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"{source}: {dotted}: params.yaml has no section {'.'.join(parents[:i + 1])!r}")
            node = node[part]
        node[leaf] = value
    return out


def check(name: str, params_file: Path = Path("params.yaml"), presets_dir: Path = PRESETS_DIR) -> dict[str, object]:
    """The preset's overrides, after checking that params.yaml with them applied is valid."""
    path = preset_path(name, presets_dir)
    flat = overrides(path)
    load_params(params_file)  # params.yaml itself first: its own errors name it
    base = yaml.safe_load(Path(params_file).read_text())
    parse_params(apply(base, flat, str(path)), f"{params_file} with preset {path}")
    return flat


def flag_value(value: object) -> str:
    """A value as DVC's -S reads it back (YAML-like: null, true, 1.5, [a,b], "quoted text")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):  # 1e-05 -> 1.0e-05: YAML 1.1 readers take an exponent without a dot as text
        text = repr(value)
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    if isinstance(value, list):
        return "[" + ",".join(flag_value(v) for v in value) + "]"
    text = str(value)
    return text if SIMPLE.fullmatch(text) and text not in ("null", "true", "false") else json.dumps(text)


def flags(flat: dict[str, object]) -> list[str]:
    return [f"{key}={flag_value(value)}" for key, value in flat.items()]


def dvc_program() -> str:
    """This interpreter's dvc (the venv's) when it has one, else the one on PATH."""
    local = Path(sys.executable).parent / "dvc"
    return str(local) if local.exists() else (shutil.which("dvc") or "dvc")


def dvc_command(name: str, extra: list[str], queue: bool = False, params_file: Path = Path("params.yaml"),
                presets_dir: Path = PRESETS_DIR) -> list[str]:
    cmd = [dvc_program(), "exp", "run"]
    if queue:
        cmd.append("--queue")
    for flag in flags(check(name, params_file, presets_dir)) + extra:
        cmd += ["-S", flag]
    return cmd


def first_comment(path: Path) -> str:
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


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
    args = ap.parse_args(argv)
    try:
        if args.command == "list":
            for name in available():
                print(f"{name:28s} {first_comment(preset_path(name))}")
            return 0
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


if __name__ == "__main__":
    sys.exit(main())
