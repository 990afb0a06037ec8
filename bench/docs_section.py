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
