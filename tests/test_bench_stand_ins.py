"""bench/method_fingerprint.py trains with a stand-in for the results file: it must take every call the
engine may make of ResultsDB, or the benchmark breaks the day the engine writes one more field."""

import inspect

import pytest

from bench.method_fingerprint import Recorder
from pipeline.results.store import ResultsDB


def a_call_of(method) -> tuple[list, dict]:
    """Arguments as the engine passes them: the required ones by position, the optional ones by name."""
    params = list(inspect.signature(method).parameters.values())[1:]  # without self
    positional = [None for p in params if p.default is inspect.Parameter.empty]
    named = {p.name: None for p in params if p.default is not inspect.Parameter.empty}
    return positional, named


@pytest.mark.parametrize("name", ["start_run", "write_round", "finish_run", "resume_problem"])
def test_the_fingerprints_recorder_takes_every_call_of_the_results_file(name):
    positional, named = a_call_of(getattr(ResultsDB, name))
    inspect.signature(getattr(Recorder, name)).bind(None, *positional, **named)  # raises TypeError if not


def test_it_records_simulated_time_only_when_the_clock_runs():
    recorder = Recorder()
    recorder.write_round("r", 1, 0.5, 10, 20, 0.1, [(0, 0.5, 3)], [(1, 0, "up", "logits", 8, -1, None)], None)
    recorder.write_round("r", 2, 0.6, 10, 20, 0.1, [(0, 0.6, 3)], [(2, 0, "up", "logits", 8, -1, 3.5)], None,
                         sim_time_s=4.0)
    assert "sim_time_s" not in recorder.rounds[0] and recorder.rounds[0]["ledger"] == [[1, 0, "up", "logits", 8, -1]]
    assert recorder.rounds[1]["sim_time_s"] == 4.0 and recorder.rounds[1]["ledger"][0][-1] == 3.5
