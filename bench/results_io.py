"""What writing a run's results costs: opening a results file, and writing one round's rows, side by side with the
alternatives pipeline/results/store.py passed over. Prints a markdown table (median milliseconds of --repeats).

    .venv/bin/python bench/results_io.py                 # K = 20 and 300 clients, FedCache-shaped rounds
    .venv/bin/python bench/results_io.py --clients 300 --repeats 20

Rows:
- a fresh DuckDB database, opened and closed: what every connection cost when each opened its own (DuckDB builds
  its catalog of functions each time);
- ResultsDB.connect, writing and reading: the file attached to the process's one in-memory host database;
- one round's rows (K clients, 2K payload rows, four cache metrics) on an open connection, one INSERT a row
  (executemany) against one statement a table (insert_rows);
- ResultsDB.write_round: the whole round as a training stage writes it (connect, insert, detach: written through).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.results.store import RunResultsDB, insert_rows  # noqa: E402

COMM = ("run_id", "round", "client_id", "direction", "kind", "bytes", "peer_id", "sim_time_s")
CLIENTS = ("run_id", "round", "client_id", "acc", "n_test", "val_acc", "n_val")


def _median_ms(fn, repeats: int) -> float:
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _round(k: int, r: int) -> tuple[list[tuple], list[tuple], dict[str, float]]:
    """Round r's rows of FedCache at K clients, as write_round takes them: each client's accuracies, its logits up
    and knowledge down, the cache's metrics."""
    clients = [(c, 0.5, 30, 0.5, 10) for c in range(k)]
    comm = [(r, c, d, kind, 1000 + c, -1, None) for c in range(k)
            for d, kind in (("up", "logits"), ("down", "knowledge"))]
    return clients, comm, {"cache_coverage": 0.9, "cache_staleness": 0.2, "cache_teacher_acc": 0.8,
                           "cache_teacher_entropy": 1.1}


def measure(k: int, repeats: int, folder: Path) -> list[tuple[str, float]]:
    db = RunResultsDB(folder / f"run-{k}.duckdb")
    db.start_run("r", "fedcache", "mnist", "homo", {}, "bench")
    rounds = iter(range(1, 10**6))
    out = [("a fresh DuckDB database, opened and closed", _median_ms(lambda i: duckdb.connect().close(), repeats))]

    def touch(read_only: bool):
        def run(i):
            with db.connect(read_only=read_only):
                pass
        return run

    out += [("ResultsDB.connect, writing (attach, detach)", _median_ms(touch(False), repeats)),
            ("ResultsDB.connect, reading", _median_ms(touch(True), repeats))]

    def rows(r: int) -> tuple[list[tuple], list[tuple], list[tuple]]:
        clients, comm, extras = _round(k, r)
        return ([("r", r, *row) for row in clients], [("r", *row) for row in comm],
                [("r", r, name, v) for name, v in extras.items()])

    def write_round(i):
        r = next(rounds)
        db.write_round("r", r, 0.5, 1, 1, 0.1, *_round(k, r))

    def executemany(i):
        c, m, x = rows(next(rounds))
        con.executemany(f"INSERT INTO client_rounds ({', '.join(CLIENTS)}) VALUES (?, ?, ?, ?, ?, ?, ?)", c)
        con.executemany(f"INSERT INTO comm ({', '.join(COMM)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", m)
        con.executemany("INSERT INTO round_metrics VALUES (?, ?, ?, ?)", x)

    def one_statement(i):
        c, m, x = rows(next(rounds))
        insert_rows(con, "client_rounds", CLIENTS, c)
        insert_rows(con, "comm", COMM, m)
        insert_rows(con, "round_metrics", ("run_id", "round", "name", "value"), x)

    with db.connect() as con:
        out += [(f"{k} clients' rows, one INSERT a row (executemany)", _median_ms(executemany, repeats)),
                (f"{k} clients' rows, one statement a table (insert_rows)", _median_ms(one_statement, repeats))]
    out.append((f"ResultsDB.write_round, {k} clients (connect, rows, detach)", _median_ms(write_round, repeats)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 300], help="K of the round's rows")
    parser.add_argument("--repeats", type=int, default=15, help="timings per row (the median is shown)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row for k in args.clients for row in measure(k, args.repeats, Path(tmp))]
    print(f"duckdb {duckdb.__version__}, median of {args.repeats}, one thread of Python\n")
    print("| what | ms |\n|---|---|")
    seen = set()
    for what, ms in rows:
        if what not in seen:  # the per-connection rows are the same at every K
            print(f"| {what} | {ms:.1f} |")
            seen.add(what)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
