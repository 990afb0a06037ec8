"""A generated section of a docs page: the text between two marker comments, rewritten from result files.

Figures in docs are never typed by hand: a bench script renders them from its result files into the part of a
page between `begin` and `end` (appended under `heading` the first time), and a test fails when the page
differs from what the files render.
"""

from __future__ import annotations


def replace_section(text: str, begin: str, end: str, section: str, heading: str) -> str:
    """`text` with what lies between `begin` and `end` replaced by `section` (which carries both markers), or
    `section` appended under `heading` when the page has no markers yet."""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + section + rest.split(end, 1)[1]
    return f"{text.rstrip()}\n\n{heading}\n\n{section}\n"


def write_or_check(path, current: str, fresh: str, check: bool, script: str) -> int:
    """Write `fresh` over the page at `path`, or with `check` write nothing and return 1 when the page (`current`)
    is stale, naming the script that renders it; 0 otherwise."""
    import sys

    if check:
        if fresh != current:
            print(f"{path} is stale: run .venv/bin/python {script}", file=sys.stderr)
            return 1
        return 0
    path.write_text(fresh)
    print(f"wrote {path}")
    return 0
