"""95% intervals for what the report compares, and the words that follow them.

Accuracy figures come from per-client accuracies: a run's round figure is the unweighted mean over
its clients, MAUA the largest round figure, final accuracy the last. What varies if the experiment
is repeated is (a) which test images each client drew, (b) which clients the partition made, and (c)
the seed (partition, initialisation, batches). The intervals here cover:

- one seed: the clients, by a bootstrap over clients (scipy.stats.bootstrap, BCa) that recomputes
  the statistic (MAUA: the max over rounds of the resampled mean) on every resample. A client's
  accuracy already includes its own test-sampling noise, so (a) is inside this too;
- several seeds: with 3 or more, a t interval over the seeds' figures (each seed a fresh partition,
  so it covers (a), (b) and (c)); with 2, a bootstrap over clients within each seed (strata), of the
  mean over seeds: it covers (a) and (b), not (c), and says so.

A difference between two methods is paired: by client within a seed (the same clients, the same
test images) and by seed across seeds. With 20 clients the spread from client to client dominates an
unpaired interval; pairing removes it, which is why differences, not overlapping intervals, decide
"ahead" / "behind". Words follow the interval: "tied" whenever it contains 0.

`test_se` is the test-sampling standard error of a mean client accuracy alone, from each client's
binomial variance on its own split: sqrt(sum_k p_k (1 - p_k) / n_k) / K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
RESAMPLES = 4000
SEED = 12345  # the bootstrap's own seed: the same results always give the same interval

STATISTICS = ("maua", "final_acc")


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    covers: str  # which uncertainty it covers, for people (module doc)

    @property
    def verdict(self) -> str:
        """For a difference A - B: "ahead" (A), "behind", or "tied" when the interval contains 0."""
        if self.low > 0:
            return "ahead"
        if self.high < 0:
            return "behind"
        return "tied"

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


@dataclass(frozen=True)
class Accuracies:
    """One run's per-client accuracies: acc[k, r] of client k at evaluation r (rows: clients with a test
    sample), n[k] each client's test count (for test_se), in one seed."""

    acc: np.ndarray  # float [K, R]
    n: np.ndarray  # int [K]

    @classmethod
    def from_rows(cls, rows: list[tuple[int, int, float | None, int]]) -> "Accuracies | None":
        """From (round, client, acc, n_test) rows; None when no round was evaluated. A client with no test
        sample (NaN accuracy) is left out, as the round's mean leaves it out."""
        rounds = sorted({r for r, _, a, n in rows if a is not None and n > 0})
        clients = sorted({k for _, k, a, n in rows if a is not None and n > 0})
        if not rounds or not clients:
            return None
        at = {(r, k): a for r, k, a, n in rows if a is not None and n > 0}
        if len(at) != len(rounds) * len(clients):  # every evaluation evaluates every client
            missing = next((r, k) for r in rounds for k in clients if (r, k) not in at)
            raise ValueError(f"round {missing[0]} has no accuracy for client {missing[1]}")
        n = {k: n for _, k, a, n in rows if a is not None and n > 0}
        return cls(np.array([[at[(r, k)] for r in rounds] for k in clients], dtype=np.float64),
                   np.array([n[k] for k in clients], dtype=np.int64))

    def statistic(self, name: str, idx: np.ndarray | None = None) -> np.ndarray | float:
        """MAUA or final accuracy of the mean over clients `idx` ([..., K'] resamples; None: all clients)."""
        acc = self.acc if idx is None else self.acc[idx]  # [..., K', R]
        mean = acc.mean(axis=-2)  # [..., R]
        return mean.max(axis=-1) if name == "maua" else mean[..., -1]

    @property
    def test_se(self) -> float:
        """Test-sampling standard error of the final mean client accuracy (module doc)."""
        p = self.acc[:, -1]
        return float(math.sqrt(np.sum(p * (1 - p) / self.n)) / len(p))


def _bootstrap(strata: list[int], statistic) -> tuple[float, float]:
    """Percentile bounds of a BCa bootstrap resampling clients within each stratum (a seed's clients)."""
    import warnings

    from scipy.stats import bootstrap

    data = tuple(np.arange(k) for k in strata)
    with warnings.catch_warnings():  # a degenerate case (e.g. a method against itself) is handled below
        warnings.simplefilter("ignore")
        res = bootstrap(data, statistic, vectorized=True, paired=False, confidence_level=LEVEL,
                        n_resamples=RESAMPLES, method="BCa", random_state=np.random.default_rng(SEED))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):  # degenerate (every resample the same): the percentile bounds
        values = np.asarray(res.bootstrap_distribution, dtype=np.float64)
        low, high = (float(np.quantile(values, q)) for q in ((1 - LEVEL) / 2, (1 + LEVEL) / 2))
    return low, high


def bootstrap_percentile(n: int, statistic) -> tuple[float, float]:
    """Percentile bounds of a bootstrap over n clients of `statistic(idx)` ([B, n] resampled indices -> [B]):
    for a statistic that may be inf (a time to a target a resample never reaches), where BCa is undefined."""
    idx = np.random.default_rng(SEED).integers(0, n, size=(RESAMPLES, n))
    values = np.asarray(statistic(idx), dtype=np.float64)
    low, high = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], method="inverted_cdf")
    return float(low), float(high)


def mean_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): the mean over clients of one figure each, with its 95% percentile-bootstrap interval over
    clients (the privacy audit's figures)."""
    values = np.asarray(values, dtype=np.float64)
    low, high = bootstrap_percentile(len(values), lambda idx: values[idx].mean(axis=-1))
    return float(values.mean()), low, high


def t_interval(values: list[float]) -> tuple[float, float]:
    from scipy.stats import t

    mean, n = float(np.mean(values)), len(values)
    half = float(t.ppf((1 + LEVEL) / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))
    return mean - half, mean + half


def covers(seeds: int) -> str:
    if seeds >= 3:
        return f"{seeds} seeds (t interval over seeds: clients, test sampling and seed)"
    if seeds == 2:
        return "2 seeds (bootstrap over clients within each seed: clients and test sampling, not the seed)"
    return "1 seed (bootstrap over clients: clients and test sampling, not the seed)"


def run_interval(seeds: list[Accuracies], name: str) -> Interval:
    """A run's MAUA or final accuracy, averaged over its seeds (one Accuracies each), with its interval."""
    estimate = float(np.mean([s.statistic(name) for s in seeds]))
    if len(seeds) >= 3:
        low, high = t_interval([float(s.statistic(name)) for s in seeds])
    else:
        def stat(*idx, axis=-1):
            return np.mean([s.statistic(name, i) for s, i in zip(seeds, idx)], axis=0)

        low, high = _bootstrap([len(s.n) for s in seeds], stat)
    return Interval(estimate, low, high, covers(len(seeds)))


def paired_difference(a: list[Accuracies], b: list[Accuracies], name: str) -> Interval:
    """A - B in MAUA or final accuracy, paired by client within a seed and by seed across seeds (a[i] and
    b[i] are the same seed's runs, on the same clients)."""
    if len(a) != len(b):
        raise ValueError(f"paired over seeds: {len(a)} runs against {len(b)}")
    for x, y in zip(a, b):
        if x.acc.shape[0] != y.acc.shape[0] or not np.array_equal(x.n, y.n):
            raise ValueError("paired by client: the two runs' clients or test splits differ (another partition?)")
    per_seed = [float(x.statistic(name) - y.statistic(name)) for x, y in zip(a, b)]
    estimate = float(np.mean(per_seed))
    if len(a) >= 3:
        low, high = t_interval(per_seed)
    else:
        def stat(*idx, axis=-1):
            return np.mean([x.statistic(name, i) - y.statistic(name, i) for x, y, i in zip(a, b, idx)], axis=0)

        low, high = _bootstrap([len(x.n) for x in a], stat)
    return Interval(estimate, low, high, covers(len(a)))


def decimals(half_width: float) -> int:
    """Decimals (of a percentage) an interval of this half-width (a fraction) supports, 0 to 2: whole points
    from a half-width of 2.5 points, tenths from 0.25, hundredths below."""
    points = half_width * 100
    if not points > 0:
        return 2
    return int(min(2, max(0, -math.floor(math.log10(points / 2.5)))))


def percent(iv: Interval, signed: bool = False) -> str:
    """'71.3% [68.7, 73.9]' (or '+1.8 [-3.0, +7.1]' points for a difference), to the interval's precision."""
    d = decimals(iv.half_width)
    if signed:  # a bound near 0 keeps the decimals that show its side of 0 (the word depends on it)
        while d < 2 and any(round(v * 100, d) == 0 and v != 0 for v in (iv.low, iv.high)):
            d += 1
    # rounded first, + 0.0: a value that rounds to zero prints as 0, never as "-0"
    est, low, high = (round(v * 100, d) + 0.0 for v in (iv.estimate, iv.low, iv.high))
    if signed:
        return f"{est:+.{d}f} [{low:+.{d}f}, {high:+.{d}f}]"
    return f"{est:.{d}f}% [{low:.{d}f}, {high:.{d}f}]"
