"""The view in the URL: what a link reproduces besides the runs, the target, the baseline and the tab.

    ?smoothing=0.6     the curves' EMA weight           ?x=time      the accuracy chart's x axis (round, time, sim)
    ?setup=0           set-up traffic left out (1: in)  ?seeds=1     seed groups on (0: off)
    ?setting=homo      the settings offered (repeated; absent: all)
    ?algorithm=fedavg  the algorithms offered (repeated; absent: all)
    ?filter=train.lr&value=0.01   the param filter and the values it keeps (repeated)

A session takes each from the URL once, when it opens (the widget's key not in its state yet); every run then
writes the view back, so the address bar is always a link to what is on screen. Values a link cannot mean (an
axis that is not offered, a smoothing out of range) are ignored.
"""

from __future__ import annotations

import streamlit as st

FLAGS = {"1": True, "0": False}


def opened_with(state_key: str, url_key: str, parse) -> bool:
    """At a session's first run: the widget `state_key` set from ?url_key= (parsed; None: not a value it takes).
    Returns whether it was."""
    if state_key in st.session_state or url_key not in st.query_params:
        return False
    try:
        value = parse(st.query_params[url_key])
    except ValueError:
        return False
    if value is None:
        return False
    st.session_state[state_key] = value
    return True


def flag(text: str) -> bool | None:
    return FLAGS.get(text)


def smoothing(text: str) -> float | None:
    value = float(text)
    return value if 0 <= value <= 0.95 else None


def write(url_key: str, value) -> None:
    """?url_key=value (a list: repeated; None or an empty list: left out)."""
    if value is None or (isinstance(value, list) and not value):
        st.query_params.pop(url_key, None)
    elif isinstance(value, bool):
        st.query_params[url_key] = "1" if value else "0"
    else:
        st.query_params[url_key] = value if isinstance(value, list) else str(value)


def write_narrowed(url_key: str, picked: list, options: list) -> None:
    """A filter's values, only when they leave some options out (all picked: the URL says nothing)."""
    write(url_key, None if set(options) <= set(picked) else list(picked))
