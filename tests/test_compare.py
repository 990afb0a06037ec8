"""The comparison table: bytes to target with and without set-up, speed-up against the baseline."""

import pytest

from pipeline.results.compare import RunSeries, comparison


def _series(algorithm, accs, per_round, setup=0, setting="homo"):
    """Round 0 sends `setup` bytes (half up, half down); every later round `per_round` bytes."""
    rounds = [(0, accs[0], setup, 0)] + [(r, a, per_round, 0) for r, a in enumerate(accs[1:], start=1)]
    return RunSeries(f"{algorithm}-{setting}", algorithm, setting, rounds)


def test_bytes_to_target_with_and_without_the_setup_upload():
    fedcache = _series("fedcache", [0.1, 0.5, 0.8], per_round=10, setup=1000)
    row, = comparison([fedcache], target=0.75)
    assert row["bytes_to_target"] == 1020 and row["bytes_to_target_no_setup"] == 20
    assert row["bytes_setup"] == 1000 and row["bytes_training"] == 20


def test_speedup_is_against_fedavg_at_the_target_when_it_reaches_it():
    fedavg = _series("fedavg", [0.1, 0.6, 0.8], per_round=1000)
    fedcache = _series("fedcache", [0.1, 0.8, 0.8], per_round=10, setup=100)
    fd = _series("fd", [0.1, 0.5, 0.6], per_round=1)
    rows = {r["algorithm"]: r for r in comparison([fedavg, fedcache, fd], target=0.75)}
    assert rows["fedcache"]["speedup"] == pytest.approx(2000 / 110)
    assert rows["fedavg"]["speedup"] == pytest.approx(1.0)
    assert rows["fd"]["speedup"] is None  # never reaches 75 %
    assert {r["speedup_vs"] for r in rows.values()} == {"fedavg"}
    assert rows["fedcache"]["speedup_target"] == 0.75


def test_speedup_and_bytes_to_its_level_with_and_without_the_setup_upload():
    """The paper counts no one-time set-up: the speed-up and the bytes to its level come both ways."""
    fedavg = _series("fedavg", [0.1, 0.6, 0.8], per_round=1000)
    fedcache = _series("fedcache", [0.1, 0.8, 0.8], per_round=10, setup=100)
    rows = {r["algorithm"]: r for r in comparison([fedavg, fedcache], target=0.75)}
    assert rows["fedcache"]["speedup"] == pytest.approx(2000 / 110)  # set-up counted
    assert rows["fedcache"]["speedup_no_setup"] == pytest.approx(2000 / 10)
    assert (rows["fedcache"]["bytes_to_level"], rows["fedcache"]["bytes_to_level_no_setup"]) == (110, 10)
    assert (rows["fedavg"]["bytes_to_level"], rows["fedavg"]["speedup_no_setup"]) == (2000, pytest.approx(1.0))


def test_speedup_falls_back_to_the_level_fedavg_reached():
    """FedAvg below the target: speed-ups at FedAvg's MAUA (the paper's reference is parameter averaging),
    not against whichever run happened to be costliest."""
    fedavg = _series("fedavg", [0.1, 0.6, 0.65], per_round=1000)
    fedcache = _series("fedcache", [0.1, 0.7, 0.8], per_round=10)
    rows = {r["algorithm"]: r for r in comparison([fedavg, fedcache], target=0.75)}
    assert rows["fedcache"]["speedup_target"] == pytest.approx(0.65)
    assert rows["fedcache"]["speedup"] == pytest.approx(2000 / 10)
    assert rows["fedavg"]["bytes_to_target"] is None


def test_baseline_is_per_setting_and_selectable():
    homo = [_series("fedavg", [0.1, 0.8], per_round=100), _series("fd", [0.1, 0.8], per_round=5)]
    hetero = [_series("fd", [0.1, 0.8], per_round=5, setting="hetero"),
              _series("fedcache", [0.1, 0.8], per_round=1, setting="hetero")]
    rows = comparison(homo + hetero, target=0.75)
    by = {(r["algorithm"], r["setting"]): r for r in rows}
    assert by[("fd", "homo")]["speedup"] == pytest.approx(20.0)
    # no FedAvg among the heterogeneous runs: the costliest run reaching the target is the reference
    assert by[("fedcache", "hetero")]["speedup"] == pytest.approx(5.0)
    assert by[("fedcache", "hetero")]["speedup_vs"] == "fd"
    chosen = {(r["algorithm"], r["setting"]): r for r in comparison(homo + hetero, target=0.75, baseline="fd")}
    assert chosen[("fedavg", "homo")]["speedup"] == pytest.approx(0.05)


def _timed(name, accs, times, busy=None, client_s=None, label=None):
    rounds = [(r, a, 10, 0) for r, a in enumerate(accs)]
    return RunSeries(name, name.split("-")[0], "homo", rounds, label,
                     sim_times=dict(enumerate(times)), busy_s=busy, client_s=client_s)


def test_time_to_target_and_the_waiting_share(tmp_path):
    """Issue 24: simulated seconds to the target (the same rules as bytes to it) and the waiting share."""
    from pipeline.results.report import format_table, plot_accuracy_vs_sim_time, write_outputs

    sync = _timed("fedavg-1", [0.1, 0.6, 0.8, 0.9], [1.0, 11.0, 21.0, 31.0], busy=45.0, client_s=60.0,
                  label="fedavg (schedule=sync)")
    slow = _timed("fd-1", [0.1, 0.5, 0.6], [1.0, 5.0, 9.0], busy=30.0, client_s=30.0)  # never reaches it
    plain = _series("local", [0.1, 0.8], per_round=0)  # devices off: no simulated time
    rows = {r["run_id"]: r for r in comparison([sync, slow, plain], target=0.75)}
    assert rows["fedavg-1"]["time_to_target"] == 21.0  # the round that first reaches 0.75
    assert rows["fedavg-1"]["waiting_share"] == pytest.approx(0.25) and rows["fedavg-1"]["sim_time_s"] == 31.0
    assert rows["fd-1"]["time_to_target"] is None and rows["fd-1"]["waiting_share"] == 0.0
    assert rows["fd-1"]["time_to_level"] is None  # the speed-up's level is fedavg's 0.75: fd never gets there
    assert rows["local-homo"]["sim_time_s"] is None and rows["local-homo"]["time_to_target"] is None
    md = format_table(list(rows.values()))
    assert "| simulated s | time to 75% | waiting share |" in md.splitlines()[0]
    assert "| fedavg (schedule=sync) | homo | 3 |" in md and "| 31.0 | 21.0 s | 25.0% |" in md
    assert "| 9.0 | not reached | 0.0% |" in md
    local_line = next(line for line in md.splitlines() if line.startswith("| local |"))
    assert local_line.count("— (no simulated time: devices off)") == 2
    assert all(line.count("|") == md.splitlines()[0].count("|") for line in md.splitlines()[:5])
    # without any simulated time the table is as before (no time columns)
    assert "time to" not in format_table([rows["local-homo"]])
    # a run timed before the waiting figures were recorded
    old = comparison([_timed("fd-2", [0.1, 0.8], [1.0, 2.0])], target=0.75)
    assert "— (not recorded" in format_table(old)
    write_outputs(list(rows.values()), tmp_path / "metrics.json", tmp_path / "report")
    assert "time_to_target" in (tmp_path / "report" / "comparison.csv").read_text().splitlines()[0]
    assert plot_accuracy_vs_sim_time([sync, slow, plain], tmp_path / "t.png") and (tmp_path / "t.png").stat().st_size
    assert not plot_accuracy_vs_sim_time([plain], tmp_path / "none.png") and not (tmp_path / "none.png").exists()
