"""Figures as SVG and PDF files: vl-convert (`vl-convert-python`) renders an Altair chart's
Vega-Lite spec without a browser. Streamlit's own chart menu offers PNG only.

The views hand st.download_button a callable (chart_file), which Streamlit runs only when the
button is clicked, on a thread of its own: drawing the page costs nothing more. The first file a
server process renders takes about 0.4 s (vl-convert starting its JavaScript engine), later ones
about 0.05 s.
"""

from __future__ import annotations

import importlib.util
import threading
from functools import partial
from typing import Callable

import altair as alt

PACKAGE = "vl-convert-python"
WIDTH = 720  # px of plot: on the page a chart takes its column's width, a file needs one
FORMATS = {"svg": "image/svg+xml", "pdf": "application/pdf"}

try:  # Streamlit converts charts under this lock: Altair's theme and data transformer are global
    from streamlit.elements.vega_charts import _altair_globals_lock as _ALTAIR_LOCK
except ImportError:  # another Streamlit: a lock of our own still keeps our threads apart
    _ALTAIR_LOCK = threading.Lock()


def available() -> bool:
    """Whether vl-convert is installed (checked without importing it: the import takes a moment)."""
    return importlib.util.find_spec("vl_convert") is not None


def vega_lite_spec(chart: alt.TopLevelMixin) -> dict:
    """The chart's Vega-Lite spec with its data inline, at WIDTH, in Altair's default (white) theme."""
    with _ALTAIR_LOCK, alt.theme.enable("default"), alt.data_transformers.enable("default", max_rows=None):
        return chart.properties(width=WIDTH).to_dict()


def chart_bytes(chart: alt.TopLevelMixin, fmt: str) -> bytes:
    """The chart as an SVG or PDF file."""
    import vl_convert

    spec = vega_lite_spec(chart)
    version = alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0]  # v6.4.1 -> 6.4: the Vega-Lite Altair writes
    kwargs = {"vl_version": version} if version in vl_convert.get_vegalite_versions() else {}
    if fmt == "svg":
        return vl_convert.vegalite_to_svg(spec, **kwargs).encode()
    if fmt == "pdf":
        return vl_convert.vegalite_to_pdf(spec, **kwargs)
    raise ValueError(f"unknown figure format {fmt!r}: expected one of {', '.join(FORMATS)}")


def chart_file(chart: alt.TopLevelMixin, fmt: str, filename: str | None = None) -> Callable[[], bytes]:
    """A callable that renders the chart when called (st.download_button's deferred data); with the button's
    `filename`, the file it makes stays served until that button's next click (keep_served)."""
    return partial(_made, chart, fmt, filename)


def _made(chart: alt.TopLevelMixin, fmt: str, filename: str | None) -> bytes:
    data = chart_bytes(chart, fmt)
    if filename is not None:
        keep_served(data, FORMATS[fmt], filename)
    return data


KEPT = "dashboard: downloads made on click"  # the media files' pseudo-session that keeps them (keep_served)


def keep_served(data: bytes, mimetype: str, filename: str) -> bool:
    """Keep the file a click makes served until the next file made under `filename` replaces it. Streamlit stores a
    deferred download's file under no element, so the end of any script run marks it for deletion and the next one
    deletes it: with the auto-refresh checking every second (a fragment run each time), two runs could end before
    the browser fetched the file, and the download was an error page named by the file's hash. Registered under
    `filename` (one file per button), it stays. Uses Streamlit's media file manager from the inside: when that is
    not as expected, nothing is kept and downloads work as before (returns False)."""
    try:
        from streamlit import runtime
        from streamlit.runtime.media_file_storage import MediaFileKind

        if not runtime.exists():
            return False
        manager = runtime.get_instance().media_file_mgr
        # the id the download's own file gets (the same data, type and name): stored now if not already
        file_id = manager._storage.load_and_get_id(data, mimetype, MediaFileKind.DOWNLOADABLE, filename)
        with manager._lock:
            manager._files_by_session_and_coord[KEPT][filename] = file_id
        return True
    except Exception:  # noqa: BLE001 - another Streamlit: no keeping, no harm
        return False
