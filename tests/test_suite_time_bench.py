"""docs/testing.md's measured suite times are what bench/results/suite-*.json render (bench/suite_time.py), and a
run's JUnit file is read into those figures: counts by outcome, the session's seconds, the sum, the tier split."""

from __future__ import annotations

import json

import pytest

from bench import suite_time


def _junit(path, cases: list[tuple[str, str, float, str]], seconds: float) -> None:
    """A JUnit file as pytest writes it: cases of (classname, name, seconds, outcome)."""
    body = "".join(f'<testcase classname="{c}" name="{n}" time="{t}">'
                   + ("" if o == "passed" else f'<{o} message="x" />') + "</testcase>" for c, n, t, o in cases)
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    f'tests="{len(cases)}" time="{seconds}">{body}</testsuite></testsuites>')


CASES = [("tests.test_a", "test_one", 1.25, "passed"), ("tests.test_a", "test_two[x/y z]", 30.0, "passed"),
         ("tests.test_b", "test_three", 0.5, "failure"), ("tests.test_b", "test_four", 0.0, "skipped")]


def test_the_page_is_what_the_result_files_render():
    assert suite_time.main(["--check"]) == 0, "run .venv/bin/python bench/suite_time.py --docs"


def test_a_run_is_summarised_from_its_junit_file(tmp_path):
    full, fast = tmp_path / "full.xml", tmp_path / "fast.xml"
    _junit(full, CASES, 40.5)
    _junit(fast, [CASES[0], CASES[2]], 3.0)  # the unit tier: test_one and test_three
    entry = suite_time.summarise(full, "make test", "abc1234", unit=fast, cpu="Made-up CPU, 2 CPUs", date="2026-01-01")
    assert (entry["passed"], entry["failed"], entry["skipped"]) == (2, 1, 1)
    assert (entry["pytest_s"], entry["sum_s"], entry["unit_sum_s"], entry["e2e_sum_s"]) == (40.5, 31.8, 1.8, 30.0)
    assert entry["slowest"][0] == ["tests/test_a.py::test_two[x/y z]", 30.0]

    (tmp_path / "suite-made-up.json").write_text(json.dumps([entry]))
    section = suite_time.render(tmp_path)
    assert "| 2026-01-01 | abc1234 | `make test` | 2 | 1 | 40.5 | 31.8 | 1.8 / 30.0 |  |" in section
    assert "test_a::test_two[x/y z] 30.0, test_a::test_one 1.2" in section  # a test id's own slashes are kept
    assert section.startswith(suite_time.BEGIN) and section.endswith(suite_time.END)


def test_a_file_that_is_not_junit_is_refused_naming_it(tmp_path):
    bad = tmp_path / "log.txt"
    bad.write_text("1194 passed in 200 s")
    with pytest.raises(SystemExit, match=r"log\.txt is not a readable JUnit XML file.*--junitxml"):
        suite_time.summarise(bad, "make test", "abc1234")
