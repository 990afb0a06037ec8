"""docs/speed.md's measured sections, rendered from the result files the speed benches write (issue 39).

    .venv/bin/python bench/speed_docs.py           # rewrite docs/speed.md's sections from bench/results/
    .venv/bin/python bench/speed_docs.py --check   # exit 1 when the page differs from what the files render

The files: bench/results/official-round-<cpu>.json (bench/official_round.py: the official FedCache code's demo
round against ours), scaling-<cpu>.json (bench/scaling.py: cost against K) and roofline-<cpu>.md
(bench/roofline.py: the round against the CPU's peak; roofline-demo-<cpu>.md for `--settings demo`), one of each
per CPU kind measured. The speed levers have their own section in docs/executors.md (bench/levers.py --docs). No
figure on the page is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]  # the pipeline, and the sibling bench modules (also as bench.speed_docs)

import official_round  # noqa: E402
import scaling  # noqa: E402
from docs_section import replace_section, write_or_check  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "speed.md"
NOT_MEASURED = "Not measured yet on any CPU."


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: begin (bench/speed_docs.py) -->", f"<!-- {name}: end -->"


def official_section(results: list[dict]) -> str:
    """Each CPU's official-against-ours table (official_round.markdown), its title demoted under the page's."""
    parts = []
    for result in results:
        title, *rest = official_round.markdown(result, result["rows"]).splitlines()
        parts += [f"### {result['cpu']}", "", *"\n".join(rest).strip().splitlines(), ""]
    return "\n".join(parts).strip() or NOT_MEASURED


def scaling_section(results: list[dict]) -> str:
    """Each CPU's scaling table (scaling.table), its trends, skipped cells and the paper-scale memory check."""
    parts = []
    for result in results:
        head = result["header"]
        groups = f" (groups of up to {head['group_size']})" if head["executor"] == "vectorized" else ""
        parts += [f"### {head['cpu']}", "",
                  f"{head['data']}, {head['samples_per_client']} samples per client (Dirichlet 1.0); "
                  f"{head['threads']} torch threads, batch {head['batch']}, float32 (the harness's; not train.precision's "
                  f"auto), executor {head['executor']}{groups}; "
                  f"{head['rounds']} timed round(s), the last reported; measured {head['date']} with "
                  f"`{head['command']}`.", "",
                  scaling.table(result["rows"], with_eval=any(r.get("eval_s") is not None for r in result["rows"])), "",
                  *[f"- trend, {name}: {text}" for name, text in result["trends"].items()],
                  *[f"- {line}" for line in result["skipped"]], f"- {result['check']}", ""]
    return "\n".join(parts).strip() or NOT_MEASURED


def roofline_section(files: list[Path]) -> str:
    """Each CPU's roofline file as bench/roofline.py wrote it, its headings moved two levels down."""
    parts = []
    for f in files:
        parts += [("##" + line) if line.startswith("#") else line for line in f.read_text().splitlines()] + [""]
    return "\n".join(parts).strip() or NOT_MEASURED


SECTIONS = {  # name: (page heading, result files, renderer)
    "official": ("## The official code's demo round against ours", "official-round-*.json", official_section),
    "scaling": ("## How a round's cost grows with K", "scaling-*.json", scaling_section),
    "roofline": ("## A round against the machine's peak (roofline)", "roofline-*.md", roofline_section),
}


def render(text: str, results_dir: Path = RESULTS) -> str:
    """`text` (docs/speed.md) with every section rewritten from the result files in `results_dir`."""
    for name, (heading, pattern, renderer) in SECTIONS.items():
        files = sorted(results_dir.glob(pattern))
        content = renderer(files) if pattern.endswith(".md") else renderer([json.loads(f.read_text()) for f in files])
        begin, end = markers(name)
        text = replace_section(text, begin, end, f"{begin}\n{content}\n{end}", heading)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/speed.md is stale; write nothing")
    args = ap.parse_args(argv)
    current = DOCS.read_text()
    return write_or_check(DOCS, current, render(current), args.check, "bench/speed_docs.py")


if __name__ == "__main__":
    sys.exit(main())
