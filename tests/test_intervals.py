"""Intervals and the words that follow them (pipeline.results.intervals, compare.differences, the report's tables).

Each test names the defect it catches. Expected values are computed here by hand (float64), not taken
from the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.results.compare import RunSeries, differences, method_rows
from pipeline.results.intervals import Accuracies, Interval, decimals, paired_difference, percent, run_interval
from pipeline.results.report import format_differences, format_table, verdict_line


def _accs(seed: int, shift: float = 0.0, noise: float = 0.0, K: int = 20, R: int = 4, n: int = 500) -> Accuracies:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.4, 0.9, K)[:, None] + np.linspace(0, 0.05, R)[None, :]  # rising over rounds
    extra = np.random.default_rng(seed + 1000).normal(0, noise, (K, R)) if noise else 0.0
    return Accuracies(np.clip(base + shift + extra, 0, 1), np.full(K, n))


def test_a_constant_per_client_gap_is_resolved_exactly():
    """Fails if differences are not paired by client (client spread would swamp a 1-point gap) or the sign
    is flipped."""
    a, b = _accs(0, shift=0.01), _accs(0)
    iv = paired_difference([a], [b], "maua")
    assert iv.estimate == pytest.approx(0.01, abs=1e-12)
    assert iv.low == pytest.approx(0.01, abs=1e-9) and iv.high == pytest.approx(0.01, abs=1e-9)
    assert iv.verdict == "ahead"
    assert paired_difference([b], [a], "maua").verdict == "behind"
    # unpaired, the same two runs' MAUA intervals overlap widely: pairing is what resolves the gap
    ra, rb = run_interval([a], "maua"), run_interval([b], "maua")
    assert ra.low < rb.high


def test_noise_around_zero_is_tied():
    """Fails if a difference whose interval contains 0 is called ahead or behind."""
    a, b = _accs(3, noise=0.03), _accs(3, noise=0.0)
    iv = paired_difference([a], [b], "final_acc")
    assert iv.low < 0 < iv.high
    assert iv.verdict == "tied"


def test_maua_statistic_is_the_max_over_rounds_of_the_client_mean():
    """Fails if MAUA is taken per client (mean of maxima) instead of the max of the per-round means."""
    acc = np.array([[0.9, 0.1], [0.1, 0.9]])  # round means 0.5, 0.5; per-client maxima 0.9
    a = Accuracies(acc, np.array([10, 10]))
    assert a.statistic("maua") == pytest.approx(0.5)
    assert a.statistic("final_acc") == pytest.approx(0.5)


def test_three_seeds_give_a_t_interval_over_the_seeds():
    """Fails if 3 or more seeds do not use the t interval over seeds (hand computed: t(0.975, 2) = 4.302653)."""
    a = [_accs(0, shift=s) for s in (0.01, 0.02, 0.03)]
    b = [_accs(0)] * 3
    iv = paired_difference(a, b, "maua")
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert iv.estimate == pytest.approx(0.02, abs=1e-12)
    assert (iv.low, iv.high) == (pytest.approx(0.02 - half, abs=1e-6), pytest.approx(0.02 + half, abs=1e-6))
    assert "3 seeds" in iv.covers


def test_test_sampling_standard_error_by_hand():
    """Fails if test_se is not sqrt(sum p(1-p)/n) / K over the final round."""
    a = Accuracies(np.array([[0.0, 0.5], [0.0, 0.9]]), np.array([100, 400]))
    assert a.test_se == pytest.approx(math.sqrt(0.25 / 100 + 0.09 / 400) / 2)


def test_pairing_refuses_runs_on_different_clients():
    """Fails if runs on two different partitions are paired client by client."""
    with pytest.raises(ValueError, match="paired by client"):
        paired_difference([_accs(0)], [_accs(0, K=19)], "maua")


@pytest.mark.parametrize("half, digits", [(0.03, 0), (0.02, 1), (0.004, 1), (0.002, 2)])
def test_figures_carry_the_precision_the_interval_supports(half, digits):
    """Fails if a figure is printed with more decimals than its interval supports (or fewer)."""
    assert decimals(half) == digits
    text = percent(Interval(0.7, 0.7 - half, 0.7 + half, ""))
    assert text.split("%")[0] == f"{70:.{digits}f}"


def _series(name: str, seed: int, accs: Accuracies, nbytes: int = 1000) -> RunSeries:
    K, R = accs.acc.shape
    rows = [(r + 1, k, float(accs.acc[k, r]), int(accs.n[k])) for r in range(R) for k in range(K)]
    rounds = [(0, None, 0, 0)] + [(r + 1, float(accs.acc[:, r].mean()), nbytes, nbytes) for r in range(R)]
    return RunSeries(f"{name}-{seed}", name, "homo", rounds, name, seed=seed, clients=rows)


def test_differences_against_local_and_fedcache_with_words():
    """Fails if a pair is missing, compared against the wrong reference, or worded against its interval."""
    series = [_series("fedcache", 0, _accs(0, shift=0.02)), _series("local", 0, _accs(0)),
              _series("fd", 0, _accs(0, noise=0.03))]
    rows = {(r["label"], r["vs"]): r for r in differences(series)}
    # local against fedcache is the mirror of fedcache against local: listed once
    assert set(rows) == {("fedcache", "local"), ("fd", "local"), ("fd", "fedcache")}
    assert rows[("fedcache", "local")]["maua_verdict"] == "ahead"
    assert rows[("fd", "local")]["maua_verdict"] == "tied"
    text = format_differences(list(rows.values()))
    assert "tied" in text and "ahead" in text and "best" not in text
    assert verdict_line(list(rows.values())).startswith("MAUA: ")


def test_seeds_are_grouped_per_method_and_paired_by_seed():
    """Fails if runs of several seeds are not grouped into one method row, or pairs mix seeds."""
    series = []
    for seed in range(3):
        series += [_series("fedcache", seed, _accs(seed, shift=0.01 * (seed + 1))), _series("local", seed, _accs(seed))]
    (fc, loc) = method_rows(series)
    assert (fc["label"], fc["seeds"], loc["seeds"]) == ("fedcache", 3, 3)
    row = next(r for r in differences(series) if r["label"] == "fedcache")
    assert row["seeds"] == 3 and row["maua_diff"] == pytest.approx(0.02, abs=1e-12)


def test_the_run_table_shows_intervals_not_a_winner():
    """Fails if the report's table drops the intervals or the test-sampling standard error."""
    from pipeline.results.compare import comparison

    rows = comparison([_series("fedcache", 0, _accs(0, shift=0.02)), _series("local", 0, _accs(0))], 0.5)
    text = format_table(rows)
    assert "[95% CI]" in text and "Test-sampling standard error" in text
    assert all(r["maua_low"] <= r["maua"] <= r["maua_high"] for r in rows)
    assert "best" not in text.lower()


def _timed(name: str, label: str, step_s: float, rounds: int, acc_of_round, K: int = 8) -> RunSeries:
    """A timed run: round r (1..rounds) ends at r * step_s simulated seconds; client k's accuracy there is
    acc_of_round(r) + 0.01 * k (round 0, at 0 s: 0.1)."""
    rows = [(0, k, 0.1, 100) for k in range(K)]
    rows += [(r, k, acc_of_round(r) + 0.01 * k, 100) for r in range(1, rounds + 1) for k in range(K)]
    rounds_ = [(r, None, 0, 0) for r in range(rounds + 1)]
    return RunSeries(f"{label}-0", name, "homo", rounds_, label, sim_times={r: r * step_s for r in range(rounds + 1)},
                     seed=0, clients=rows)


def test_schedules_are_read_on_one_grid_up_to_the_common_budget():
    """Fails if runs of unequal simulated length are compared at their own ends (async ran 40 s, sync 20 s: both
    must be read at 20 s), if a client's accuracy at an instant is not its last evaluation before it, or if the
    time to the target is not interpolated on the grid (hand computed below)."""
    from pipeline.results.compare import budget_rows

    sync = _timed("fedcache", "fedcache (schedule=sync)", 5.0, 4, lambda r: 0.3 + 0.1 * r)  # 0.4 .. 0.7 at 5..20 s
    asyn = _timed("fedcache", "fedcache (schedule=async)", 2.0, 20, lambda r: min(0.9, 0.3 + 0.05 * r))  # to 40 s
    rows = {r["label"]: r for r in budget_rows([sync, asyn], target=0.6)}
    s, a = rows["fedcache (schedule=sync)"], rows["fedcache (schedule=async)"]
    assert s["budget_s"] == a["budget_s"] == 20.0
    offset = 0.01 * np.mean(range(8))  # the clients' mean offset, 0.035
    assert s["acc_at_budget"] == pytest.approx(0.7 + offset)
    assert a["acc_at_budget"] == pytest.approx(0.8 + offset)  # round 10 at 20 s, not round 20 at 40 s
    # sync on the grid 2, 4, ..., 20 s: 0.1+o until 5 s, 0.4+o at 6 and 8 s, 0.5+o at 10 s ...: the mean first
    # passes 0.6 at 16 s (0.6 + o), after 0.5 + o at 14 s: interpolated 14 + (0.6 - 0.535) / 0.1 * 2 = 15.3 s
    assert s["time_to_target"] == pytest.approx(14 + (0.6 - (0.5 + offset)) / 0.1 * 2)
    assert a["vs"] == "fedcache (schedule=sync)" and a["diff"] == pytest.approx(0.1) and a["verdict"] == "ahead"
    assert s["vs"] is None  # the sync run is the reference, not compared with itself
