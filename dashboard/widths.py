"""How wide a table's text is on screen, so that its columns can be sized to fit it (no Streamlit here).

st.dataframe draws its cells on a canvas (Glide Data Grid) in Streamlit's font, 14 px Source Sans, with 8 px of
padding each side; a text wider than its column is cut off ('ot reached' for a right-aligned 'not reached'). The
advance widths below were measured in Chromium with canvas measureText on that font (regular and bold), so a
column's width can be set from its longest text. Characters not listed count as the widest one (an em dash).

The main area beside the sidebar of a 1280 px wide window (Streamlit's wide layout, measured in Chromium) is
MAIN_AREA_PX: a table whose columns add up to no more fits it without a horizontal scroll bar.
"""

from __future__ import annotations

import math

MAIN_AREA_PX = 820
PADDING_PX = 16  # the cell's 8 px each side
LINE_PX = 20  # a wrapped line of 14 px text
WRAP_ROW_PX = 68  # the row height at which the grid wraps text columns (above 4rem = 64 px): three lines

_CHARS = "".join(chr(c) for c in range(32, 127)) + "—±×…·Δ"
_REGULAR = [
    2.8, 4.05, 5.96, 6.96, 6.96, 11.54, 8.53, 3.49, 4.24, 4.24, 5.85, 6.96, 3.49, 4.35, 3.49, 4.9, 6.96, 6.96, 6.96,
    6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 6.96, 3.49, 3.49, 6.96, 6.96, 6.96, 5.95, 11.86, 7.6, 8.23, 7.99, 8.61, 7.38,
    6.92, 8.64, 9.13, 3.68, 6.71, 8.11, 6.8, 10.18, 9.06, 9.3, 7.92, 9.3, 7.97, 7.48, 7.5, 9.03, 7.21, 11.0, 7.18,
    6.66, 7.55, 4.24, 4.9, 4.24, 6.96, 7.0, 7.59, 7.06, 7.74, 6.38, 7.77, 6.94, 4.09, 7.06, 7.62, 3.44, 3.46, 6.93,
    3.57, 11.61, 7.66, 7.59, 7.77, 7.77, 4.86, 5.87, 4.73, 7.62, 6.54, 10.07, 6.24, 6.54, 5.95, 4.24, 3.37, 4.24,
    6.96, 11.2, 6.96, 6.96, 13.27, 3.49, 8.23]
_BOLD = [
    2.8, 4.76, 7.52, 7.39, 7.39, 12.0, 9.34, 4.2, 4.82, 4.82, 6.4, 7.39, 4.2, 4.65, 4.2, 4.75, 7.39, 7.39, 7.39, 7.39,
    7.39, 7.39, 7.39, 7.39, 7.39, 7.39, 4.2, 4.2, 7.39, 7.39, 7.39, 6.48, 12.63, 8.02, 8.47, 8.15, 8.89, 7.67, 7.34,
    8.93, 9.44, 4.21, 7.13, 8.6, 7.25, 10.67, 9.31, 9.58, 8.34, 9.58, 8.58, 7.78, 7.78, 9.31, 7.78, 11.38, 7.94, 7.35,
    7.57, 4.82, 4.75, 4.82, 7.39, 7.0, 7.77, 7.38, 8.02, 6.55, 8.02, 7.25, 4.77, 7.48, 7.99, 3.86, 3.89, 7.67, 4.0,
    12.0, 8.01, 7.77, 8.02, 8.02, 5.57, 6.2, 5.36, 7.95, 7.32, 10.86, 7.2, 7.29, 6.44, 4.82, 3.75, 4.82, 7.39, 11.2,
    7.39, 7.39, 13.69, 4.2, 8.96]
_WIDTHS = {False: dict(zip(_CHARS, _REGULAR)), True: dict(zip(_CHARS, _BOLD))}


def text_px(text: str, bold: bool = False) -> float:
    """The width of `text` in the grid's font, in px."""
    widths = _WIDTHS[bold]
    return sum(widths.get(c, 14.0) for c in str(text))


def column_px(header: str, texts=(), bold: bool = False) -> int:
    """The width that shows a column's header and every one of its texts whole."""
    widest = max([text_px(header), *(text_px(t, bold) for t in texts)])
    return math.ceil(widest) + PADDING_PX


def wrapped_lines(text: str, width: int) -> float:
    """How many lines `text` takes in a column `width` px wide, wrapped at spaces; infinite when a word is wider
    than the column (it would be cut)."""
    room, space = width - PADDING_PX, text_px(" ")
    lines, used = 1, 0.0
    for word in str(text).split(" "):
        w = text_px(word)
        if w > room:
            return math.inf
        if used and used + space + w > room:
            lines, used = lines + 1, w
        else:
            used += (space if used else 0.0) + w
    return lines


def narrowest_wrapped(header: str, texts, lines: int = WRAP_ROW_PX // LINE_PX) -> int:
    """The narrowest width at which the header stays whole and every text wraps into at most `lines` lines."""
    width = column_px(header)
    while any(wrapped_lines(t, width) > lines for t in texts):
        width += 4
    return width


def fit(widths: dict[str, int], wrappable: dict[str, tuple[str, list[str]]],
        area: int = MAIN_AREA_PX) -> tuple[dict[str, int], int | None]:
    """Column widths that fit `area`: as given when they do; else the text columns in `wrappable` (column ->
    (header, texts)) narrowed, widest first, as far as their texts wrap into three lines, with the row height that
    wraps them (None: one line each, no wrapping)."""
    out = dict(widths)
    if sum(out.values()) <= area:
        return out, None
    for column in sorted(wrappable, key=lambda c: -out[c]):
        out[column] = min(out[column], narrowest_wrapped(*wrappable[column]))
        if sum(out.values()) <= area:
            break
    return out, WRAP_ROW_PX
