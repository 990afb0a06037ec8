"""Progress bars with a time estimate (tqdm), readable in a terminal and in logs.

In a terminal a bar redraws in place. Where stderr is not a terminal (DVC's output piped to a
file, CI), a redrawn bar would be one endless line: there each update the bar shows is a plain
line of its own, at most one every `every_s` seconds (and the last). FEDCACHE_PROGRESS=0 turns the
bars off. `state(bar)` is the bar as one line, for logs (flows/ sends it to the Prefect run's).
"""

from __future__ import annotations

import os
import sys
from typing import Callable, TextIO

from tqdm import tqdm

LOG_EVERY_S = 30.0
# (total, unit) -> a bar: how a stage's loop asks for a bar over its inner steps (clients of a round)
BarFactory = Callable[[int, str], tqdm]


class _Lines:
    """A file for tqdm that turns each redraw ("\\r<bar>") into one plain line."""

    def __init__(self, out: TextIO):
        self.out = out

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            print(line, file=self.out, flush=True)

    def flush(self) -> None:
        self.out.flush()


def enabled() -> bool:
    return os.environ.get("FEDCACHE_PROGRESS", "1") != "0"


def bar(total: int, desc: str, unit: str, initial: int = 0, leave: bool = True, every_s: float = LOG_EVERY_S,
        out: TextIO | None = None) -> tqdm:
    """A bar over `total` units: .update(n), .set_postfix_str(...), .close() when done. Not a terminal:
    a line per shown update (a bar that does not `leave` shows nothing there)."""
    out = out or sys.stderr
    if not enabled() or (not leave and not out.isatty()):
        return tqdm(total=total, initial=initial, disable=True)
    if out.isatty():
        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, file=out, dynamic_ncols=True)
    # leave=False: closing does not print the last line a second time
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False, file=_Lines(out),
                mininterval=every_s, maxinterval=max(every_s, 10.0), ascii=True, ncols=110)


def nested(desc: str) -> BarFactory:
    """Bars over the clients of one round, under a stage's bar over rounds (drawn in a terminal only)."""
    return lambda total, unit: bar(total, desc, unit, leave=False)


def no_bar(total: int, unit: str) -> tqdm:
    return tqdm(total=total, disable=True)


def state(progress: tqdm) -> str:
    """The bar's current state as one line (as it is drawn), e.g. for a log."""
    return progress.format_meter(**progress.format_dict).replace("\r", "").strip()
