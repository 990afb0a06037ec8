"""bench/results_io.py: one tiny run prints a row for each way of opening a results file and of writing a round,
each with a time, and the rounds it wrote are in the file; never how fast anything is."""

from __future__ import annotations

import re

from bench import results_io


def test_it_prints_every_row_with_a_time(capsys):
    assert results_io.main(["--clients", "3", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9.]+) \|$", out, re.MULTILINE))
    assert set(rows) == {"a fresh DuckDB database, opened and closed", "ResultsDB.connect, writing (attach, detach)",
                         "ResultsDB.connect, reading", "3 clients' rows, one INSERT a row (executemany)",
                         "3 clients' rows, one statement a table (insert_rows)",
                         "ResultsDB.write_round, 3 clients (connect, rows, detach)"}
    assert all(float(ms) > 0 for ms in rows.values())


def test_both_ways_of_inserting_write_the_same_rows(tmp_path):
    """The comparison is like with like: executemany and insert_rows each wrote their rounds' rows in full."""
    import duckdb

    results_io.measure(4, 2, tmp_path)
    con = duckdb.connect(str(tmp_path / "run-4.duckdb"), read_only=True)
    per_round = con.execute("SELECT round, count(*) FROM comm GROUP BY round ORDER BY round").fetchall()
    clients = con.execute("SELECT count(DISTINCT round), count(*) FROM client_rounds").fetchone()
    con.close()
    assert per_round == [(r, 8) for r in range(1, 7)]  # 2 + 2 + 2 rounds (executemany, insert_rows, write_round)
    assert clients == (6, 24)
