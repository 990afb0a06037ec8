"""Split a dataset over K clients: Dirichlet(alpha) per class, or n classes per client.

Sample identity is explicit: the partition orders every client's training samples one
after another, so a sample's global id is its position in `train_index`, and
(client, local index) follow from `train_offsets`.

Each client also gets two splits it never trains on, both with the class proportions of its
training split (the FedCache/FedML convention: a client is evaluated on the label mix it trained on):
- test: every class's test images (`partition.test_fraction` of them, 1 by default) are divided over
  the clients in the shares of that class's training samples: disjoint across clients and as large
  as the test set allows, however small the training scale-down (the figures to rank methods by);
- validation: `partition.val_ratio` x the client's training count of each class, drawn from the
  training samples the partition did not use; when it uses all of them, `partition.val_holdout` of
  each client's own samples of each class are held out instead. Defaults are tuned on it, never on test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.errors import ConfigError, InputFileError, UserError

from pipeline.seeds import rng

if TYPE_CHECKING:  # the training core runs without the config library (bench/gpu_check.sh)
    from pipeline.config import PartitionParams


# what partition.npz holds, in this order
PARTITION_FIELDS = ("num_clients", "num_classes", "train_index", "train_offsets", "test_index", "test_offsets",
                    "train_labels", "test_labels", "val_index", "val_offsets", "val_labels")


class PartitionError(UserError, ValueError):
    """The requested split is impossible; the message says which knob to change."""


@dataclass(frozen=True)
class Partition:
    num_clients: int
    num_classes: int
    train_index: np.ndarray  # int64 [N]: dataset index of global sample id g
    train_offsets: np.ndarray  # int64 [K+1]: client k owns ids train_offsets[k]:train_offsets[k+1]
    test_index: np.ndarray  # int64 [M]: dataset (test set) index, grouped by client
    test_offsets: np.ndarray  # int64 [K+1]
    train_labels: np.ndarray  # int64 [N]: label of global sample id g
    test_labels: np.ndarray  # int64 [M]
    val_index: np.ndarray  # int64 [V]: dataset (training set) index of the validation samples, grouped by client
    val_offsets: np.ndarray  # int64 [K+1]
    val_labels: np.ndarray  # int64 [V]

    @property
    def num_train(self) -> int:
        return int(self.train_offsets[-1])

    def train_client(self) -> np.ndarray:
        """Client id of every global training sample id."""
        return np.repeat(np.arange(self.num_clients), np.diff(self.train_offsets))

    def test_client(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_clients), np.diff(self.test_offsets))

    def local_index(self) -> np.ndarray:
        """Position of every global training sample inside its client's data."""
        return np.arange(self.num_train) - np.repeat(self.train_offsets[:-1], np.diff(self.train_offsets))

    def client_train(self, k: int) -> np.ndarray:
        return self.train_index[self.train_offsets[k] : self.train_offsets[k + 1]]

    def client_test(self, k: int) -> np.ndarray:
        return self.test_index[self.test_offsets[k] : self.test_offsets[k + 1]]

    def client_val(self, k: int) -> np.ndarray:
        return self.val_index[self.val_offsets[k] : self.val_offsets[k + 1]]

    def val_client(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_clients), np.diff(self.val_offsets))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            num_clients=self.num_clients,
            num_classes=self.num_classes,
            train_index=self.train_index,
            train_offsets=self.train_offsets,
            test_index=self.test_index,
            test_offsets=self.test_offsets,
            train_labels=self.train_labels,
            test_labels=self.test_labels,
            val_index=self.val_index,
            val_offsets=self.val_offsets,
            val_labels=self.val_labels,
        )
        tmp.replace(path)  # atomic: a killed stage never leaves a half-written partition

    @classmethod
    def load(cls, path: Path) -> "Partition":
        if not Path(path).exists():
            raise FileNotFoundError(f"partition file {path} not found: run the partition stage first (dvc repro partition)")
        try:
            with np.load(path, allow_pickle=False) as z:
                fields = {name: z[name] for name in PARTITION_FIELDS}
        except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
            raise InputFileError(f"{path} is damaged, from an older version (no validation split) or not a partition "
                                 f"file ({type(err).__name__}: {err}); rebuild it: .venv/bin/dvc repro -f partition") from None
        return cls(num_clients=int(fields["num_clients"]), num_classes=int(fields["num_classes"]),
                   **{name: fields[name] for name in PARTITION_FIELDS[2:]})


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer counts summing to `total`, proportional to `weights` (Hamilton's method)."""
    if total == 0 or weights.sum() == 0:
        return np.zeros(len(weights), dtype=np.int64)
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    short = total - counts.sum()
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:short]] += 1
    return counts


def scale_fraction(num_train: int, p: PartitionParams) -> float:
    """The share of every class a partition uses: K * samples_per_client / N, or data_fraction, or 1.

    Never silently less than asked: K * samples_per_client beyond the N training samples there are
    stops with the most that is available."""
    if p.samples_per_client is not None:
        asked = p.num_clients * p.samples_per_client
        if asked > num_train:
            raise ConfigError(
                f"partition.samples_per_client = {p.samples_per_client} with partition.num_clients = {p.num_clients} "
                f"asks for {asked:,} training samples, but the dataset has {num_train:,} (at most "
                f"{num_train // p.num_clients} per client at this num_clients); lower samples_per_client or "
                "num_clients, set samples_per_client: null to use every sample, or use the full dataset")
        return asked / num_train
    return p.data_fraction if p.data_fraction is not None else 1.0


def _pooled(class_size: int, fraction: float) -> int:
    """How many of a class's samples are used (rounded per class)."""
    return int(round(class_size * fraction))


def samples_used(class_sizes, p: PartitionParams) -> int:
    """The number of training samples a partition uses, given the dataset's per-class training counts.

    Exactly what `make_partition` pools (per-class rounding), so an early check on the dataset's
    sizes and the real split agree; `int(N * fraction)` would not (125.99... truncates to 125).
    """
    sizes = [int(n) for n in class_sizes]
    fraction = scale_fraction(sum(sizes), p)
    return sum(_pooled(n, fraction) for n in sizes)


def check_clients_fit(p: PartitionParams, train_class_sizes) -> None:
    """Before any output: K clients of at least min_samples each fit in the samples the split will
    use (counted by `samples_used`, the split's own count)."""
    used = samples_used(train_class_sizes, p)
    if p.num_clients * p.min_samples > used:
        raise ConfigError(
            f"partition.num_clients = {p.num_clients}: with partition.min_samples = {p.min_samples} "
            f"it needs at least {p.num_clients * p.min_samples} training samples, but only "
            f"{used} are used; lower num_clients or min_samples, or use more data"
        )


def _class_orders(labels: np.ndarray, num_classes: int, seed: int, name: str) -> list[np.ndarray]:
    """Per class: the dataset indices in a seeded shuffled order (a pool is its head)."""
    return [rng(seed, name, c).permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]


def _class_pools(orders: list[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Per class: the head of its seeded order, `fraction` of the class."""
    return [order[: _pooled(len(order), fraction)] for order in orders]


def _trained(counts: np.ndarray, holdout: float) -> np.ndarray:
    """[K, C] counts a client trains on once `holdout` of each class is held out for validation (_validation)."""
    return counts - np.floor(holdout * counts).astype(np.int64)


def _dirichlet_counts(pools: list[np.ndarray], p: PartitionParams, seed: int, holdout: float) -> np.ndarray:
    """[K, C] training counts; Dirichlet per class, redrawn until every client is big enough."""
    K = p.num_clients
    sizes = np.array([len(x) for x in pools])
    smallest = None
    for attempt in range(p.max_retries):
        counts = np.stack(
            [_largest_remainder(int(n), rng(seed, "partition.dirichlet", attempt, c).dirichlet(np.full(K, p.alpha)))
             for c, n in enumerate(sizes)],
            axis=1,
        )
        per_client = _trained(counts, holdout).sum(axis=1)
        if per_client.min() >= p.min_samples:
            return counts
        smallest = int(per_client.min())
    raise PartitionError(
        f"partition: after {p.max_retries} Dirichlet draws (alpha = {p.alpha}) some client still had "
        f"fewer than partition.min_samples = {p.min_samples} training samples (smallest seen: {smallest}); "
        "raise alpha, lower min_samples or num_clients, use more data, or raise max_retries"
    )


def _pathological_counts(pools: list[np.ndarray], p: PartitionParams, holdout: float) -> np.ndarray:
    """[K, C] counts: client k holds classes k*n .. k*n+n-1 (mod C), each class split evenly."""
    K, C, n = p.num_clients, len(pools), p.classes_per_client
    if n > C:
        raise PartitionError(f"partition.classes_per_client = {n}: the dataset has only {C} classes")
    holds = np.zeros((K, C), dtype=bool)
    for k in range(K):
        holds[k, [(k * n + j) % C for j in range(n)]] = True
    counts = np.zeros((K, C), dtype=np.int64)
    for c in range(C):
        holders = np.flatnonzero(holds[:, c])
        if len(holders):
            counts[holders, c] = _largest_remainder(len(pools[c]), np.ones(len(holders)))
    if _trained(counts, holdout).sum(axis=1).min() < p.min_samples:
        raise PartitionError(
            f"partition: a client gets only {int(_trained(counts, holdout).sum(axis=1).min())} samples with "
            f"classes_per_client = {n} and num_clients = {K}; lower partition.min_samples or num_clients, or use more data"
        )
    return counts


def _assign(pools: list[np.ndarray], counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hand out each class pool to clients by `counts` [K, C]; return (index grouped by client, offsets)."""
    K, C = counts.shape
    per_client: list[list[np.ndarray]] = [[] for _ in range(K)]
    for c in range(C):
        cuts = np.concatenate([[0], np.cumsum(counts[:, c])])
        for k in range(K):
            per_client[k].append(pools[c][cuts[k] : cuts[k + 1]])
    chunks = [np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64) for parts in per_client]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in chunks])]).astype(np.int64)
    return np.concatenate(chunks).astype(np.int64), offsets


def make_partition(train_y: np.ndarray, test_y: np.ndarray, num_classes: int, p: PartitionParams, seed: int) -> Partition:
    sizes = np.bincount(train_y, minlength=num_classes)[:num_classes]
    fraction = scale_fraction(int(sizes.sum()), p)
    train_orders = _class_orders(train_y, num_classes, seed, "partition.train")
    train_pools = _class_pools(train_orders, fraction)
    test_pools = _class_pools(_class_orders(test_y, num_classes, seed, "partition.test"), p.test_fraction)
    used = samples_used(sizes, p)  # the sum of the pools' sizes; check_clients_fit counts the same way
    if p.num_clients * p.min_samples > used:
        raise PartitionError(
            f"partition.num_clients = {p.num_clients}: needs at least {p.num_clients * p.min_samples} "
            f"training samples (min_samples = {p.min_samples} each) but only {used} are used"
        )

    holdout = p.val_holdout if fraction >= 1.0 else 0.0  # what a full-data partition holds out for validation
    if p.scheme == "dirichlet":
        train_counts = _dirichlet_counts(train_pools, p, seed, holdout)
    else:
        train_counts = _pathological_counts(train_pools, p, holdout)

    val_pools, val_counts = _validation(train_orders, train_pools, train_counts, fraction, p)
    if fraction >= 1.0:  # every sample is used: the validation split is held out of the clients' own samples
        train_pools = [pool[len(held):] for pool, held in zip(train_pools, val_pools)]
        train_counts = train_counts - val_counts
    # Test split: each class's test pool is divided in the same shares as its training
    # samples, so every client's test label mix follows its training label mix.
    test_counts = _shares(np.array([len(x) for x in test_pools]), train_counts)
    train_index, train_offsets = _assign(train_pools, train_counts)
    test_index, test_offsets = _assign(test_pools, test_counts)
    val_index, val_offsets = _assign(val_pools, val_counts)
    return Partition(p.num_clients, num_classes, train_index, train_offsets, test_index, test_offsets,
                     train_y[train_index].astype(np.int64), test_y[test_index].astype(np.int64),
                     val_index, val_offsets, train_y[val_index].astype(np.int64))


def _shares(totals: np.ndarray, train_counts: np.ndarray) -> np.ndarray:
    """[K, C] counts: each class's `totals[c]` divided over the clients in the shares of their training counts."""
    return np.stack([_largest_remainder(int(totals[c]), train_counts[:, c].astype(float))
                     for c in range(len(totals))], axis=1)


def _validation(orders: list[np.ndarray], train_pools: list[np.ndarray], train_counts: np.ndarray, fraction: float,
                p: PartitionParams) -> tuple[list[np.ndarray], np.ndarray]:
    """(per-class pools, [K, C] counts) of the validation split, following each client's label mix.

    A scaled-down partition draws val_ratio x each class's training count from the class's samples it
    did not use (the rest of the class's seeded order; refused, naming the key, when too few are left).
    One that uses every sample has nothing else to draw from: each client's own samples give up
    `val_holdout` of each class instead, taken from the head of the class pool (make_partition trains
    on the rest)."""
    if fraction < 1.0:
        wanted = np.rint(p.val_ratio * np.array([len(x) for x in train_pools])).astype(np.int64)
        unused = [order[len(pool):] for order, pool in zip(orders, train_pools)]
        short = [c for c in range(len(unused)) if wanted[c] > len(unused[c])]
        if short:
            c = short[0]
            most = min(len(u) / max(len(pool), 1) for u, pool in zip(unused, train_pools))
            raise ConfigError(
                f"partition.val_ratio = {p.val_ratio}: class {c} needs {int(wanted[c]):,} validation samples but only "
                f"{len(unused[c]):,} of its training samples are left unused by the partition (val_ratio can be at most "
                f"{most:.2f} here); lower val_ratio, or scale the partition down further")
        return [u[:n] for u, n in zip(unused, wanted)], _shares(wanted, train_counts)
    held = np.floor(p.val_holdout * train_counts).astype(np.int64)
    return [pool[: int(n)] for pool, n in zip(train_pools, held.sum(axis=0))], held


def partition_stats(part: Partition) -> dict:
    """Counts per client per class, for the stats file and the dashboard heatmap."""
    C = part.num_classes
    train = np.zeros((part.num_clients, C), dtype=np.int64)
    test = np.zeros((part.num_clients, C), dtype=np.int64)
    val = np.zeros((part.num_clients, C), dtype=np.int64)
    np.add.at(train, (part.train_client(), part.train_labels), 1)
    np.add.at(test, (part.test_client(), part.test_labels), 1)
    np.add.at(val, (part.val_client(), part.val_labels), 1)

    def per_client(counts: np.ndarray) -> dict:
        sizes = counts.sum(axis=1)
        return {"min": int(sizes.min()), "mean": float(sizes.mean()), "max": int(sizes.max())}

    return {
        "num_clients": part.num_clients,
        "num_classes": C,
        "num_train": int(train.sum()),
        "num_val": int(val.sum()),
        "num_test": int(test.sum()),
        "train_per_client": per_client(train),
        "val_per_client": per_client(val),
        "test_per_client": per_client(test),
        "train_counts": train.tolist(),
        "val_counts": val.tolist(),
        "test_counts": test.tolist(),
    }


def write_stats(stats: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats, indent=1))
    tmp.replace(path)
