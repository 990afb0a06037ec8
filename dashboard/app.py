"""FedCache results dashboard (Streamlit): `make dashboard`, or

    streamlit run dashboard/app.py --server.address 127.0.0.1 -- --results-db results/results.duckdb

Layout only; the data comes from dashboard.data (the results index plus the per-run files of
stages that ran since it was built) and dashboard.stages (partition, knowledge cache, params).
The sidebar picks runs; below it, the tabs. Only the open tab's content runs (a click on another
tab reruns the page and writes the tab into the URL, ?tab=Cache), in a fragment (a widget there
reruns that tab alone). Every few seconds a fragment that draws nothing checks whether the results
files changed (a few stat calls) and reruns the page only when they did, so a training stage writing
rounds shows up without a reload, while a page whose data stand still is never rerun under the
user's click (a rerun gives every download button a new file id and drops the old one). A locked
file just means the previous snapshot stays on screen until the next change. A damaged file is
named, with the command that makes it again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` puts dashboard/ on the path, not the repo
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402
from streamlit import config as st_config  # noqa: E402

from dashboard import data, stages, urlstate  # noqa: E402
from dashboard.config import Config, load_config  # noqa: E402
from dashboard.tabs import (  # noqa: E402
    view_ablations, view_cache, view_clients, view_comm, view_neighbours, view_params, view_partition, view_privacy)
from dashboard.views import guarded, view_overview  # noqa: E402

TABS = ["Accuracy & bytes", "Clients", "Communication", "Privacy", "Cache", "Ablations", "Partition", "Neighbours",
        "Params"]
STATS_TABS = {"Clients", "Partition"}  # the tabs that read the partition's stats
PARAMS_TABS = {"Partition", "Neighbours"}  # and the params of the run they show (_stage_params)


def retry_soon(seconds: float) -> None:
    """Rerun the whole app after `seconds` (so an empty or busy DB is picked up once it fills)."""
    if seconds <= 0:
        return

    def _tick() -> None:
        if st.session_state.get("_retry_armed"):
            st.session_state["_retry_armed"] = False
            st.rerun()
        st.session_state["_retry_armed"] = True

    st.fragment(_tick, run_every=seconds)()


def data_version(cfg: Config, stale_at: float | None = None) -> tuple:
    """What the page shows depends on: when each results file (and the partition's) last changed, and whether the
    moment has come when a run shown 'running' turns 'stale' (`stale_at`, epoch s: no round came for a while)."""
    return (data.results_version(cfg.results_db, cfg.run_files_dir, cfg.stats_path, cfg.partition_path),
            stale_at is not None and time.time() >= stale_at)


def watch(cfg: Config, every: float) -> None:
    """Every `every` s, rerun the page if the data changed since it was drawn (data_version); else do nothing, so
    that no rerun comes between the user and a widget or a download. A fragment that draws nothing."""
    def _check() -> None:
        if data_version(cfg, st.session_state.get("_stale_at")) != st.session_state.get("_version"):
            st.rerun()

    st.fragment(_check, run_every=every)()


# ----------------------------------------------------------------------------- sidebar

def _keep_valid(key: str, options: list, default: list, admit=lambda option, kept: True) -> list:
    """Session value of a multiselect: the default at first, then the user's choice minus options
    that vanished, plus options that appeared since and that `admit(option, kept)` takes (a run that
    just started with the selection's set-up shows up at once). Returns the new options not taken.

    What the app adds must survive a request the browser sent before it drew the addition: every request
    carries all widget values, and an auto-refresh check's (every few seconds) can leave with the old one and
    undo the addition. So the additions stay pending until a request comes back with them; until then a value
    equal to the one before them is taken for such a request and they are added again. A user's other change
    (anything but that old value) ends the wait and stands."""
    seen = st.session_state.get(f"_{key}_options")
    pending = st.session_state.pop(f"_{key}_pending", None)  # (value before, added): not seen back yet
    left_out = []
    if key not in st.session_state or seen is None:
        st.session_state[key] = list(default)
    else:
        kept = [v for v in st.session_state[key] if v in options]
        waiting = None
        if pending and not set(pending[1]) <= set(kept) and kept == [v for v in pending[0] if v in options]:
            kept += [v for v in pending[1] if v in options and v not in kept]  # undone by a stale request: again
            waiting = pending
        added = []
        for o in options:
            if o not in seen and o not in kept:
                (added if admit(o, kept + added) else left_out).append(o)
        if added:
            waiting = (waiting[0], waiting[1] + added) if waiting else (list(kept), added)
        if waiting:
            st.session_state[f"_{key}_pending"] = waiting
        st.session_state[key] = kept + added
    st.session_state[f"_{key}_options"] = list(options)
    return left_out


def from_url(key: str, options: list) -> list:
    """The values of a repeated query parameter (?runs=a&runs=b) that are among `options`."""
    return [v for v in st.query_params.get_all(key) if v in options]


def announce_new_runs(sb, runs: pd.DataFrame, left_out: list[str], chosen: list[str]) -> None:
    """Runs that appeared with another set-up are named, not added: the view stays as the user left it."""
    present = set(runs["run_id"])
    announced = [r for r in st.session_state.get("_announced", []) + left_out if r not in chosen and r in present]
    st.session_state["_announced"] = list(dict.fromkeys(announced))
    if announced:
        labels = runs.set_index("run_id").loc[announced, "label"]
        sb.info("New since this page opened, with another set-up (not added): " + ", ".join(labels) +
                ". Pick them above to compare.")


def baseline_picker(sb, algorithms: list[str]) -> str:
    """The speed-up baseline: an algorithm of the chosen runs, or the costliest run reaching the target.
    It follows the default (FedAvg when chosen) until the user picks another."""
    options = [*algorithms, data.COSTLIEST]
    default = data.default_baseline(algorithms)
    if "baseline" not in st.session_state and st.query_params.get("baseline") in options:  # a shared link
        st.session_state["baseline"], st.session_state["_baseline_default"] = st.query_params["baseline"], None
    if st.session_state.get("baseline") not in options or \
            st.session_state.get("baseline") == st.session_state.get("_baseline_default"):
        st.session_state["baseline"] = default
    st.session_state["_baseline_default"] = default
    baseline = sb.selectbox("Speed-up baseline", options, key="baseline",
                            format_func=lambda a: a or "costliest run reaching the target",
                            help="Speed-up = the baseline's bytes to the target over a run's (same setting; "
                                 "pipeline/results/compare.py)")
    st.query_params["baseline"] = baseline
    return baseline


def group_seeds_toggle(sb, picked: pd.DataFrame) -> bool:
    """'Group seeds': on by default when 2+ of the chosen runs differ only in their seed; it follows that
    default until the user flips it."""
    default = data.has_seed_groups(picked)
    if urlstate.opened_with("group_seeds", "seeds", urlstate.flag):  # a shared link: the user's choice
        st.session_state["_group_seeds_default"] = None
    if "group_seeds" not in st.session_state or \
            st.session_state["group_seeds"] == st.session_state.get("_group_seeds_default"):
        st.session_state["group_seeds"] = default
    st.session_state["_group_seeds_default"] = default
    grouped = sb.toggle("Group seeds", key="group_seeds",
                        help="Runs whose params differ only in `seed`: one line (mean) with a min-max band, and one "
                             "table row (mean ± std)")
    urlstate.write("seeds", grouped)
    return grouped


def param_filter(sb, pool: pd.DataFrame) -> pd.DataFrame:
    """Narrow the runs on offer by any param on which they differ (a dotted key, e.g. `index.R`, or a run
    column as `run.git_rev`), to the values picked."""
    varying = data.varying_params(pool)
    urlstate.opened_with("param_key", "filter", lambda k: k if k in varying else None)  # a shared link's filter
    if st.session_state.get("param_key") not in (None, *varying):
        st.session_state["param_key"] = None  # the key no longer varies among the runs on offer
    key = sb.selectbox("Filter by param", [None, *varying], key="param_key",
                       format_func=lambda k: "(no filter)" if k is None else k,
                       help="Any params.yaml key (or run column) on which the runs on offer differ")
    urlstate.write("filter", key)
    if key is None:
        urlstate.write("value", None)
        return pool
    values = varying[key]
    _keep_valid("param_values", values, from_url("value", values) or values)
    picked = sb.multiselect(f"{key} is", values, key="param_values", help="values as JSON; (absent): no such key")
    urlstate.write("value", picked)
    return data.with_param(pool, key, picked)


def sidebar(cfg: Config, runs: pd.DataFrame) -> tuple[list[str], bool, float, str, bool]:
    sb = st.sidebar
    sb.header("Runs")
    settings_opts = sorted(runs["setting"].dropna().unique())
    algo_opts = sorted(runs["algorithm"].unique())
    # a shared link may narrow them (?setting=homo&algorithm=fedavg); the URL names them only when they narrow
    _keep_valid("settings", settings_opts, from_url("setting", settings_opts) or settings_opts)
    _keep_valid("algorithms", algo_opts, from_url("algorithm", algo_opts) or algo_opts)
    settings = sb.multiselect("Setting", settings_opts, key="settings",
                              help="homo: one model for all clients; hetero: A1/A2/A3 by client index")
    algos = sb.multiselect("Algorithms", algo_opts, key="algorithms")
    urlstate.write_narrowed("setting", settings, settings_opts)
    urlstate.write_narrowed("algorithm", algos, algo_opts)
    pool = param_filter(sb, runs[runs["setting"].isin(settings) & runs["algorithm"].isin(algos)])
    options = pool.sort_values("started_at", ascending=False)["run_id"].tolist()
    info = runs.set_index("run_id")
    # a shared link (?runs=...&target=...&baseline=...&tab=..., and dashboard.urlstate's) reproduces the view; else
    # the default selection

    def same_setup(run: str, kept: list[str]) -> bool:
        return not kept or data.setup_mismatch(runs, [*kept, run]) is None

    left_out = _keep_valid("runs", options, from_url("runs", options) or data.default_selection(pool), same_setup)
    chosen = sb.multiselect(
        "Runs (side by side)", options, key="runs",
        format_func=lambda r: f"{info.at[r, 'label']} · {pd.Timestamp(info.at[r, 'started_at']):%m-%d %H:%M}"
                              f"{'' if info.at[r, 'status'] == 'finished' else ' · ' + info.at[r, 'status_shown']}")
    announce_new_runs(sb, runs, left_out, chosen)
    st.query_params["runs"] = chosen
    sb.header("Display")
    baseline = baseline_picker(sb, sorted(set(info.loc[[r for r in chosen if r in info.index], "algorithm"])))
    group_seeds = group_seeds_toggle(sb, runs[runs["run_id"].isin(chosen)])
    if not urlstate.opened_with("include_setup", "setup", urlstate.flag):
        st.session_state.setdefault("include_setup", True)
    include_setup = sb.toggle("Count one-time set-up traffic", key="include_setup",
                              help="Round 0's traffic (FedCache: the hash upload). Off: training traffic only.")
    urlstate.write("setup", include_setup)
    auto = sb.toggle("Auto-refresh", value=cfg.refresh_s > 0, key="auto_refresh",
                     help="Check the results files every few seconds and redraw when they changed (a round written)")
    every = sb.number_input("every (s)", min_value=1, max_value=600, value=max(1, round(cfg.refresh_s or 5)), step=1,
                            key="refresh_s", disabled=not auto)
    sb.button("Refresh now")
    sb.caption(f"Results: `{cfg.results_db}` and what changed since in `{cfg.run_files_dir}` (read-only)")
    return chosen, include_setup, (every if auto else 0.0), baseline, group_seeds


# ----------------------------------------------------------------------------- page

def _stage_params(snap: data.Snapshot, ids: list[str]) -> dict:
    """Params for the partition/neighbour views: the first selected FedCache run, else the first selected."""
    runs = snap.runs.set_index("run_id")
    picked = [r for r in ids if r in runs.index]
    fedcache = [r for r in picked if runs.at[r, "algorithm"] == "fedcache"]
    return runs.at[(fedcache or picked)[0], "params"] if picked else {}


def read_snapshot(cfg: Config, ids: list[str]) -> tuple[data.Snapshot, str | None]:
    """A fresh snapshot, or the last one read when a file is locked by a writer or damaged (a file being
    replaced, or broken for good: the message names it and the command that makes it again)."""
    try:
        snap = data.load_snapshot(cfg.results_db, ids, cfg.lock_timeout_s, cfg.run_files_dir)
    except (data.ResultsBusy, data.ResultsDamaged) as err:
        st.session_state["_version"] = None  # read again at the next check, whatever changed
        prev = st.session_state.get("_snapshot")
        if prev is None:
            raise
        read_at = time.strftime("%H:%M:%S", time.localtime(prev.read_at))
        return prev, f"{str(err).rstrip('.')}. Showing the data read at {read_at}."
    st.session_state["_snapshot"] = snap
    return snap, None


def live_views(cfg: Config, ids: list[str], known_runs: set[str], include_setup: bool, baseline: str,
               group_seeds: bool = False, tab: str = TABS[0]) -> None:
    """The open tab's content, under the notices about the data read (stale, no rounds yet, when read,
    set-ups that differ). Run as a fragment inside that tab (a widget there reruns it alone); the whole page
    reruns when the results change (watch)."""
    tab_to_url(tab)
    try:
        snap, stale = read_snapshot(cfg, ids)
    except data.ResultsDamaged as err:
        st.error(str(err))
        return
    except data.ResultsUnavailable as err:
        st.warning(f"{err} Retrying…")
        return
    if stale is None and set(snap.runs["run_id"]) != known_runs:
        st.rerun()  # a run started or vanished: refresh the selectors too
    if stale:
        st.warning(stale)
    for r in ids:
        row = snap.runs[snap.runs["run_id"] == r]
        if not row.empty and row["n_rounds"].iloc[0] == 0:
            st.info(f"Run {snap.label(r)} has no rounds yet (status: {row['status_shown'].iloc[0]}).")
    done = ", ".join(f"{snap.label(r)}: " + ("no rounds" if pd.isna(last) else f"round {int(last)}")
                     for r, last in zip(snap.runs["run_id"], snap.runs["last_round"]) if r in ids)
    st.caption(f"Read {time.strftime('%H:%M:%S', time.localtime(snap.read_at))} · {done}")
    if mismatch := data.setup_mismatch(snap.runs, ids):
        st.warning(mismatch)
    stats = stages.load_stats(cfg.stats_path) if tab in STATS_TABS and cfg.stats_path.is_file() else None
    params = _stage_params(snap, ids) if tab in PARAMS_TABS else {}
    with guarded(tab):
        if tab == "Accuracy & bytes":
            view_overview(snap, ids, include_setup, baseline, group_seeds)
        elif tab == "Clients":
            view_clients(snap, ids, stats)
        elif tab == "Communication":
            view_comm(snap, ids, include_setup)
        elif tab == "Privacy":
            view_privacy(snap, ids, include_setup, cfg.results_db)
        elif tab == "Cache":
            view_cache(snap, ids)
        elif tab == "Ablations":
            view_ablations(snap, include_setup)
        elif tab == "Partition":
            view_partition(cfg, stats, params)
        elif tab == "Neighbours":
            view_neighbours(cfg, params)
        elif tab == "Params":
            view_params(snap, ids, cfg.run_files_dir)


def tab_to_url(tab: str) -> None:
    """The open tab into the URL (?tab=Cache), so a link opens the view on it; at every run of the tab's content,
    not only when a tab is clicked: each request resets the server's query parameters to the address the browser
    sent it with, so a request that left before a click's new address arrived (an auto-refresh check that then
    reruns the page) wrote the old tab back, and the URL named a tab that was not open. The first tab is left
    out of a URL that names none (no tab: the first)."""
    if tab != TABS[0] or "tab" in st.query_params:
        st.query_params["tab"] = tab


def open_tabs() -> list:
    """The tabs, stateful (only the open one's content runs; its label is st.session_state["tab"]). A link
    may name the tab to open (?tab=Cache); the open tab's content writes it back there (tab_to_url). Not bound
    to the URL (bind="query-params"): the tabs sit outside the auto-refreshing fragment, so its reruns never
    register them again, and a click is a plain widget change, not a URL change racing a rerun."""
    if "tab" not in st.session_state:  # the widget's id depends on its default: kept while the tabs are on screen
        opened = st.query_params.get("tab")
        st.session_state["_tab_default"] = opened if opened in TABS else None
    return st.tabs(TABS, default=st.session_state["_tab_default"], key="tab",
                   on_change="rerun")  # stateful: a click reruns the page


def hide_developer_toolbar() -> None:
    """No 'Deploy' button or developer menu (client.toolbarMode = minimal) unless the command line or a
    config file sets the mode. Streamlit sends the option as a script run starts, so the first run in a
    server sets it and reruns once (`--client.toolbarMode minimal` on the command line saves that rerun)."""
    if st_config.get_where_defined("client.toolbarMode") == st_config.ConfigOption.DEFAULT_DEFINITION:
        st.set_option("client.toolbarMode", "minimal")
        st.rerun()


def main() -> None:
    st.set_page_config(page_title="FedCache results", page_icon="📶", layout="wide")
    hide_developer_toolbar()
    cfg = load_config(sys.argv[1:])
    st.title("FedCache: accuracy and bytes communicated")
    st.session_state["_version"], st.session_state["_stale_at"] = data_version(cfg), None  # before reading: a
    try:  # write during the read is seen at the next check
        notices: list[tuple[str, str]] = []  # what was read instead of the index, and why
        runs = data.load_runs(cfg.results_db, cfg.lock_timeout_s, cfg.run_files_dir, notices)
        st.session_state["_runs"] = runs
        for kind, text in notices:
            st.warning(text) if kind == "warning" else st.caption(text)
    except data.NoResults as err:
        st.info(str(err))
        retry_soon(cfg.refresh_s)
        return
    except data.ResultsUnavailable as err:  # locked or damaged: go on with the runs read last (the views say why)
        st.session_state["_version"] = None  # and read again at the next check
        runs = st.session_state.get("_runs")
        if runs is None:
            if isinstance(err, data.ResultsDamaged):
                st.error(str(err))
                retry_soon(cfg.refresh_s)
            else:
                st.warning(f"{err} Retrying…")
                retry_soon(min(cfg.refresh_s or 2.0, 2.0))
            return
    if runs.empty:
        st.info(f"`{cfg.results_db}` has no runs yet: start a training stage (`make run` or "
                "`.venv/bin/python -m flows.train fedcache`); they appear here as soon as their first round is written.")
        retry_soon(cfg.refresh_s)
        return
    st.session_state["_stale_at"] = runs.attrs.get("next_stale")  # drawn 'running' until then
    ids, include_setup, every, baseline, group_seeds = sidebar(cfg, runs)
    if every:
        watch(cfg, every)
    if not ids:
        st.info("Pick at least one run in the sidebar.")
        return
    for name, tab in zip(TABS, open_tabs()):
        if tab.open:  # only the open tab runs: the others stay empty until clicked (a click reruns the page)
            with tab:
                st.fragment(live_views)(cfg, ids, set(runs["run_id"]), include_setup, baseline, group_seeds, tab=name)


if __name__ == "__main__":  # streamlit runs the script as __main__; importing it draws nothing
    main()
