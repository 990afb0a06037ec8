"""Tests for pipeline.data.partition on label arrays only (no images): sizes, grouping, label mixes,
determinism, bounded retries, the pathological scheme, save/load and stats."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.config import ConfigError, PartitionParams
from pipeline.data.partition import Partition, PartitionError, make_partition, partition_stats, write_stats

C = 10  # classes in the synthetic labels (10 x 600 train, 10 x 100 test; see conftest)


def pp(**kw) -> PartitionParams:
    """Partition params for the small synthetic set: all data, 10 clients, unless overridden."""
    base = dict(scheme="dirichlet", num_clients=10, alpha=0.5, samples_per_client=None, data_fraction=None,
                min_samples=10, max_retries=100)
    base.update(kw)
    return PartitionParams(**base)


def split(labels, seed=0, **kw) -> Partition:
    train_y, test_y = labels
    return make_partition(train_y, test_y, C, pp(**kw), seed)


def counts(part: Partition) -> tuple[np.ndarray, np.ndarray]:
    """[K, C] train and test counts, computed independently of partition_stats."""
    train = np.zeros((part.num_clients, part.num_classes), np.int64)
    test = np.zeros((part.num_clients, part.num_classes), np.int64)
    for k in range(part.num_clients):
        sl = slice(part.train_offsets[k], part.train_offsets[k + 1])
        train[k] = np.bincount(part.train_labels[sl], minlength=part.num_classes)
        sl = slice(part.test_offsets[k], part.test_offsets[k + 1])
        test[k] = np.bincount(part.test_labels[sl], minlength=part.num_classes)
    return train, test


def assert_well_formed(part: Partition, train_y: np.ndarray, test_y: np.ndarray) -> None:
    K = part.num_clients
    for index, offsets, labels, y in ((part.train_index, part.train_offsets, part.train_labels, train_y),
                                      (part.test_index, part.test_offsets, part.test_labels, test_y)):
        assert offsets.dtype == np.int64 and index.dtype == np.int64 and labels.dtype == np.int64
        assert offsets.shape == (K + 1,)
        assert offsets[0] == 0 and offsets[-1] == len(index) == len(labels)
        assert np.all(np.diff(offsets) >= 0)
        assert index.min() >= 0 and index.max() < len(y)            # valid dataset indices
        assert len(np.unique(index)) == len(index)                   # no sample used twice
        np.testing.assert_array_equal(labels, y[index])              # labels follow the ids
    assert part.num_train == part.train_offsets[-1]
    assert part.val_offsets.shape == (K + 1,) and part.val_offsets[-1] == len(part.val_index) == len(part.val_labels)
    np.testing.assert_array_equal(part.val_labels, train_y[part.val_index])
    # validation samples are training-set images no client trains on
    assert not set(part.val_index.tolist()) & set(part.train_index.tolist())
    assert len(np.unique(part.val_index)) == len(part.val_index)


def assert_test_mix_follows_train_mix(part: Partition) -> None:
    train, test = counts(part)
    for c in range(part.num_classes):
        if train[:, c].sum() == 0:
            assert test[:, c].sum() == 0
            continue
        expected = train[:, c] / train[:, c].sum() * test[:, c].sum()
        assert np.all(np.abs(test[:, c] - expected) <= 1), (c, train[:, c], test[:, c])
        assert np.all(test[train[:, c] == 0, c] == 0)  # no test samples of a class the client never trained on


# ------------------------------------------------------------------ sizes

def test_all_data_is_used_once_and_well_formed(synthetic_labels):
    """Fails if a full-data partition trains on its validation samples or drops a sample."""
    train_y, test_y = synthetic_labels
    part = split(synthetic_labels)
    assert_well_formed(part, train_y, test_y)
    assert part.num_clients == 10 and part.num_classes == C
    # no scale-down: every training sample is handed out, to training or (val_holdout) to validation
    np.testing.assert_array_equal(np.sort(np.concatenate([part.train_index, part.val_index])), np.arange(len(train_y)))
    assert len(part.test_index) == len(test_y)
    train, _ = counts(part)
    val = _val_counts(part)
    # each client holds out floor(0.1 x) of each class of its own samples
    np.testing.assert_array_equal(val, np.floor(0.1 * (train + val)).astype(np.int64))


def test_samples_per_client_scales_the_total(synthetic_labels):
    """Fails if the test split is cut down with the training scale-down (it must stay the whole test set)."""
    train_y, test_y = synthetic_labels
    part = split(synthetic_labels, num_clients=20, samples_per_client=50)
    assert_well_formed(part, train_y, test_y)
    # K * spc = 1000 of 6000 -> 1/6 of each class (rounded per class: at most C/2 off)
    assert abs(part.num_train - 20 * 50) <= C / 2
    np.testing.assert_array_equal(np.bincount(part.train_labels, minlength=C), np.full(C, 100))
    np.testing.assert_array_equal(np.bincount(part.test_labels, minlength=C), np.full(C, 100))  # all of it
    np.testing.assert_array_equal(np.bincount(part.val_labels, minlength=C), np.full(C, 100))  # val_ratio 1
    assert np.diff(part.train_offsets).mean() == pytest.approx(50, abs=0.5)


def test_samples_per_client_beyond_the_data_is_refused_naming_the_key(synthetic_labels):
    """Fails if asking for more training samples than exist silently returns fewer."""
    with pytest.raises(ConfigError, match=r"partition\.samples_per_client = 10000 .* asks for 50,000 .* has 6,000 "
                                          r"\(at most 1200 per client"):
        split(synthetic_labels, num_clients=5, samples_per_client=10_000)


def test_data_fraction_takes_that_share_of_every_class(synthetic_labels):
    train_y, test_y = synthetic_labels
    part = split(synthetic_labels, data_fraction=0.25)
    assert_well_formed(part, train_y, test_y)
    np.testing.assert_array_equal(np.bincount(part.train_labels, minlength=C), np.full(C, 150))
    np.testing.assert_array_equal(np.bincount(part.test_labels, minlength=C), np.full(C, 100))


def _val_counts(part: Partition) -> np.ndarray:
    val = np.zeros((part.num_clients, part.num_classes), np.int64)
    for k in range(part.num_clients):
        val[k] = np.bincount(part.val_labels[part.val_offsets[k]:part.val_offsets[k + 1]], minlength=part.num_classes)
    return val


@pytest.mark.parametrize("ratio", [0.5, 1.0, 2.0])
def test_validation_comes_from_unused_samples_in_the_clients_label_mix(synthetic_labels, ratio):
    """Fails if the validation split is not ratio x each class's training count, is drawn from samples a
    client trains on, or does not follow each client's training label mix."""
    train_y, test_y = synthetic_labels
    part = split(synthetic_labels, num_clients=10, samples_per_client=100, alpha=0.3, val_ratio=ratio)
    assert_well_formed(part, train_y, test_y)
    train, val = counts(part)[0], _val_counts(part)
    np.testing.assert_array_equal(val.sum(axis=0), np.rint(ratio * train.sum(axis=0)))
    for c in range(C):
        expected = train[:, c] / train[:, c].sum() * val[:, c].sum()
        assert np.all(np.abs(val[:, c] - expected) <= 1), (c, train[:, c], val[:, c])


def test_too_large_a_validation_ratio_is_refused_naming_the_key(synthetic_labels):
    with pytest.raises(ConfigError, match=r"partition\.val_ratio = 6\.0: class \d needs 600 validation samples but only "
                                          r"500 .* at most 5\.00"):
        split(synthetic_labels, num_clients=10, samples_per_client=100, val_ratio=6.0)


def test_test_fraction_takes_that_share_of_the_test_set(synthetic_labels):
    part = split(synthetic_labels, num_clients=10, samples_per_client=20, test_fraction=0.5)
    np.testing.assert_array_equal(np.bincount(part.test_labels, minlength=C), np.full(C, 50))
    assert_test_mix_follows_train_mix(part)


def test_pre_check_counts_the_pooled_samples_not_a_truncated_float(monkeypatch):
    # Regression: 3 clients x 42 samples of 60,000: n_train * (126 / 60000) is 125.999..., which
    # int() truncated to 125 < 3 * 42, a spurious error though 130 samples are pooled (13 per class).
    train_y = np.repeat(np.arange(C, dtype=np.int64), 6000)
    test_y = np.repeat(np.arange(C, dtype=np.int64), 1000)
    p = pp(num_clients=3, samples_per_client=42, min_samples=42, alpha=1000.0)
    part = make_partition(train_y, test_y, C, p, 0)
    assert part.num_train == 130
    assert np.diff(part.train_offsets).min() >= 42


def test_too_few_samples_for_the_clients_is_a_clear_error(synthetic_labels):
    with pytest.raises(PartitionError, match=r"partition\.num_clients = 100: needs at least 2000 .* only 1500"):
        split(synthetic_labels, num_clients=100, min_samples=20, data_fraction=0.25)


# ------------------------------------------------------------------ grouping and label mixes

@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_clients_are_contiguous_and_helpers_agree(synthetic_labels, scheme):
    part = split(synthetic_labels, scheme=scheme, num_clients=8, seed=3)
    client = part.train_client()
    local = part.local_index()
    assert len(client) == len(local) == part.num_train
    assert np.all(np.diff(client) >= 0)  # client ids never go back: each client's samples are one block
    for k in range(part.num_clients):
        lo, hi = part.train_offsets[k], part.train_offsets[k + 1]
        assert np.all(client[lo:hi] == k)
        np.testing.assert_array_equal(local[lo:hi], np.arange(hi - lo))
        np.testing.assert_array_equal(part.client_train(k), part.train_index[lo:hi])
        np.testing.assert_array_equal(part.client_test(k), part.test_index[part.test_offsets[k]:part.test_offsets[k + 1]])
    test_client = part.test_client()
    assert np.all(np.diff(test_client) >= 0) and len(test_client) == len(part.test_index)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.1, 1.0])
def test_every_client_gets_min_samples(synthetic_labels, seed, alpha):
    part = split(synthetic_labels, seed=seed, alpha=alpha, num_clients=20, min_samples=50)
    assert np.diff(part.train_offsets).min() >= 50


@pytest.mark.parametrize("kw", [dict(alpha=0.1), dict(alpha=1.0), dict(alpha=100.0, num_clients=30),
                                dict(samples_per_client=37, num_clients=13),
                                dict(scheme="pathological", num_clients=7, classes_per_client=3)])
def test_test_label_mix_follows_the_train_label_mix(synthetic_labels, kw):
    part = split(synthetic_labels, seed=5, **kw)
    assert_well_formed(part, *synthetic_labels)
    assert_test_mix_follows_train_mix(part)


def test_small_alpha_gives_skewed_label_mixes(synthetic_labels):
    skewed, _ = counts(split(synthetic_labels, alpha=0.05, min_samples=1))
    even, _ = counts(split(synthetic_labels, alpha=1000.0))
    share = lambda m: (m.max(axis=1) / m.sum(axis=1)).mean()  # noqa: E731  mean top-class share
    assert share(skewed) > 0.5 > share(even)


# ------------------------------------------------------------------ determinism

def _arrays(part: Partition):
    return (part.train_index, part.train_offsets, part.test_index, part.test_offsets, part.train_labels,
            part.test_labels, part.val_index, part.val_offsets, part.val_labels)


@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_same_seed_same_partition(synthetic_labels, scheme):
    a = split(synthetic_labels, seed=7, scheme=scheme, samples_per_client=40)
    b = split(synthetic_labels, seed=7, scheme=scheme, samples_per_client=40)
    for x, y in zip(_arrays(a), _arrays(b)):
        np.testing.assert_array_equal(x, y)


def test_different_seed_different_partition(synthetic_labels):
    a = split(synthetic_labels, seed=7)
    b = split(synthetic_labels, seed=8)
    assert not np.array_equal(a.train_offsets, b.train_offsets)
    assert not np.array_equal(a.train_index, b.train_index)


def test_different_seed_picks_different_samples_when_scaled_down(synthetic_labels):
    a = split(synthetic_labels, seed=0, data_fraction=0.1)
    b = split(synthetic_labels, seed=1, data_fraction=0.1)
    assert set(a.train_index.tolist()) != set(b.train_index.tolist())
    assert set(a.val_index.tolist()) != set(b.val_index.tolist())
    assert not np.array_equal(a.test_index, b.test_index)  # the whole test set, dealt out differently


# ------------------------------------------------------------------ bounded retries

def test_impossible_dirichlet_stops_after_max_retries(synthetic_labels):
    # alpha 0.01 puts nearly a whole class on one client: 50 clients x 100 samples never happens
    with pytest.raises(PartitionError) as excinfo:
        split(synthetic_labels, alpha=0.01, num_clients=50, min_samples=100, max_retries=5)
    msg = str(excinfo.value)
    assert "max_retries" in msg
    assert "after 5 Dirichlet draws" in msg
    assert "alpha = 0.01" in msg and "min_samples = 100" in msg


# ------------------------------------------------------------------ pathological

@pytest.mark.parametrize("K, n", [(10, 2), (7, 3), (5, 1), (4, 10)])
def test_pathological_each_client_holds_exactly_its_classes(synthetic_labels, K, n):
    part = split(synthetic_labels, scheme="pathological", num_clients=K, classes_per_client=n)
    assert_well_formed(part, *synthetic_labels)
    train, test = counts(part)
    for k in range(K):
        held = set(np.flatnonzero(train[k]).tolist())
        assert held == {(k * n + j) % C for j in range(n)}
        assert len(held) == n
        assert set(np.flatnonzero(test[k]).tolist()) <= held
    # every class held by someone is split evenly among its holders
    for c in range(C):
        holders = train[:, c][train[:, c] > 0]
        if len(holders):
            assert holders.max() - holders.min() <= 1


def test_pathological_more_classes_than_the_dataset_has(synthetic_labels):
    with pytest.raises(PartitionError, match=r"partition\.classes_per_client = 11: .*only 10 classes"):
        split(synthetic_labels, scheme="pathological", classes_per_client=11)


def test_pathological_too_small_clients(synthetic_labels):
    # 15 clients x 1 class: classes 0-4 have two holders (300 samples each), 5-9 one (600).
    # 15 x 350 <= 6000 passes the total check, but the 300-sample clients are too small.
    with pytest.raises(PartitionError, match=r"only 300 samples with classes_per_client = 1 and num_clients = 15"):
        split(synthetic_labels, scheme="pathological", num_clients=15, classes_per_client=1, min_samples=350,
              val_holdout=0.0)
    part = split(synthetic_labels, scheme="pathological", num_clients=15, classes_per_client=1, min_samples=300,
                 val_holdout=0.0)
    assert sorted(np.diff(part.train_offsets).tolist()) == [300] * 10 + [600] * 5


# ------------------------------------------------------------------ save / load / stats

def test_save_load_roundtrip(synthetic_labels, tmp_path):
    part = split(synthetic_labels, num_clients=6, samples_per_client=80, seed=4)
    path = tmp_path / "out" / "partition.npz"
    part.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["partition.npz"]  # no temp file left
    back = Partition.load(path)
    assert back.num_clients == part.num_clients and back.num_classes == part.num_classes
    assert isinstance(back.num_clients, int) and isinstance(back.num_classes, int)
    for x, y in zip(_arrays(back), _arrays(part)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(back.train_client(), part.train_client())
    np.testing.assert_array_equal(back.local_index(), part.local_index())
    np.testing.assert_array_equal(back.test_client(), part.test_client())
    assert back.num_train == part.num_train


def test_load_missing_partition_says_which_stage_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="partition stage"):
        Partition.load(tmp_path / "partition.npz")


def test_partition_stats_counts_sum_correctly(synthetic_labels, tmp_path):
    part = split(synthetic_labels, num_clients=9, samples_per_client=60, seed=2)
    stats = partition_stats(part)
    train = np.array(stats["train_counts"])
    test = np.array(stats["test_counts"])
    assert train.shape == test.shape == (9, C)
    assert stats["num_clients"] == 9 and stats["num_classes"] == C
    assert stats["num_train"] == train.sum() == part.num_train
    assert stats["num_test"] == test.sum() == len(part.test_index)
    np.testing.assert_array_equal(train.sum(axis=1), np.diff(part.train_offsets))
    np.testing.assert_array_equal(test.sum(axis=1), np.diff(part.test_offsets))
    np.testing.assert_array_equal(train.sum(axis=0), np.bincount(part.train_labels, minlength=C))
    np.testing.assert_array_equal(test.sum(axis=0), np.bincount(part.test_labels, minlength=C))
    ref_train, ref_test = counts(part)
    np.testing.assert_array_equal(train, ref_train)
    np.testing.assert_array_equal(test, ref_test)
    sizes = np.diff(part.train_offsets)
    assert stats["train_per_client"] == {"min": int(sizes.min()), "mean": pytest.approx(float(sizes.mean())),
                                         "max": int(sizes.max())}
    np.testing.assert_array_equal(np.array(stats["val_counts"]), _val_counts(part))
    assert stats["num_val"] == len(part.val_index) and stats["val_per_client"]["mean"] == len(part.val_index) / 9
    path = tmp_path / "s" / "stats.json"
    write_stats(stats, path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(stats))
    assert sorted(p.name for p in path.parent.iterdir()) == ["stats.json"]


# ------------------------------------------------------------------ real Fashion-MNIST labels

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


@pytest.mark.slow  # reads the real 70,000-image dataset: the end-to-end tier
@pytest.mark.skipif(not __import__("os").path.isdir(FASHION_MNIST_DIR),
                    reason=f"Fashion-MNIST not installed at {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")
def test_real_fashion_mnist_labels_with_the_default_params(repo_root):
    from pipeline.config import load_params
    from pipeline.data.datasets import load_dataset

    ds = load_dataset("fashion_mnist", repo_root / "data" / "raw")
    assert len(ds.train_y) == 60000 and len(ds.test_y) == 10000 and ds.num_classes == 10
    params = load_params(repo_root / "params.yaml")
    p = params.partition.model_copy(update=dict(scheme="dirichlet", num_clients=30, alpha=0.5,
                                                samples_per_client=200, data_fraction=None, min_samples=10))
    part = make_partition(ds.train_y, ds.test_y, ds.num_classes, p, params.seed)
    assert_well_formed(part, ds.train_y, ds.test_y)
    assert abs(part.num_train - 30 * 200) <= ds.num_classes / 2
    assert np.diff(part.train_offsets).min() >= 10
    assert_test_mix_follows_train_mix(part)
    again = make_partition(ds.train_y, ds.test_y, ds.num_classes, p, params.seed)
    np.testing.assert_array_equal(again.train_index, part.train_index)


def test_no_validation_split_when_a_full_data_partition_holds_nothing_out(synthetic_labels):
    """Fails if val_holdout 0 (the paper presets: every sample trains) still takes samples from training."""
    part = split(synthetic_labels, val_holdout=0.0)
    assert len(part.val_index) == 0 and part.num_train == len(synthetic_labels[0])
