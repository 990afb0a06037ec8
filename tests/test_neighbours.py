"""Neighbour search: equals brute force, never contains the sample itself, exact and HNSW."""

import numpy as np
import pytest

from pipeline.index.neighbours import NeighbourError, build_relations, label_neighbours
from pipeline.config import IndexParams


def _codes(n, d=16, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_force(codes, R, clients=None):
    sim = codes @ codes.T
    np.fill_diagonal(sim, -np.inf)
    if clients is not None:
        sim[clients[:, None] == clients[None, :]] = -np.inf
    return np.argsort(-sim, axis=1, kind="stable")[:, :R]


def test_exact_equals_brute_force():
    codes = _codes(300)
    got, kind = label_neighbours(codes, np.zeros(300, int), IndexParams(R=8))
    assert kind == "exact"
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(_brute_force(codes, 8), axis=1))


def test_never_includes_self_even_with_duplicates():
    codes = _codes(50)
    codes = np.concatenate([codes, codes, codes])  # every code appears three times
    got, _ = label_neighbours(codes, np.zeros(len(codes), int), IndexParams(R=4))
    assert not (got == np.arange(len(codes))[:, None]).any()
    # each sample's two exact copies must be among its neighbours (similarity 1)
    for i in range(len(codes)):
        copies = {j for j in (i % 50, i % 50 + 50, i % 50 + 100) if j != i}
        assert copies <= set(got[i].tolist())
    assert all(len(set(row)) == 4 for row in got.tolist())


def test_hnsw_recall_against_brute_force():
    n = 1500  # past exact_max: the HNSW index answers (the brute force below grows as n squared)
    codes = _codes(n, d=32, seed=1)
    p = IndexParams(R=10, exact_max=1000, hnsw_ef_search=200)
    got, kind = label_neighbours(codes, np.zeros(n, int), p)
    assert kind == "hnsw"
    assert not (got == np.arange(n)[:, None]).any()
    truth = _brute_force(codes, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got.tolist(), truth.tolist())])
    assert recall > 0.95


@pytest.mark.parametrize("exact_max", [10_000, 10])
def test_exclude_same_client(exact_max):
    codes = _codes(120)
    clients = np.repeat(np.arange(4), 30)
    p = IndexParams(R=5, same_client=False, exact_max=exact_max, hnsw_ef_search=200)
    got, _ = label_neighbours(codes, clients, p)
    assert (clients[got] != clients[:, None]).all()
    if exact_max > 120:
        np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(_brute_force(codes, 5, clients), axis=1))


def test_relations_stay_within_label_and_map_to_global_ids():
    codes = _codes(200)
    labels = np.tile(np.arange(4), 50)
    clients = np.repeat(np.arange(5), 40)
    rel, kinds = build_relations(codes, labels, clients, IndexParams(R=6))
    assert rel.shape == (200, 6) and set(kinds) == {0, 1, 2, 3}
    assert (labels[rel] == labels[:, None]).all()
    assert not (rel == np.arange(200)[:, None]).any()
    # label 0 alone, brute force, mapped back to global ids
    members = np.flatnonzero(labels == 0)
    expected = members[_brute_force(codes[members], 6)]
    np.testing.assert_array_equal(np.sort(rel[members], axis=1), np.sort(expected, axis=1))


def test_too_few_candidates_is_a_clear_error():
    with pytest.raises(NeighbourError, match="index.R"):
        label_neighbours(_codes(5), np.zeros(5, int), IndexParams(R=5))
    clients = np.array([0] * 8 + [1] * 2)
    with pytest.raises(NeighbourError, match="same_client"):
        label_neighbours(_codes(10), clients, IndexParams(R=3, same_client=False))


# --- binary codes (packed sign bits, the simhash encoder): Hamming distance

def _bits(n, bits=64, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, bits // 8), dtype=np.uint8)


def _hamming(codes):
    u = np.unpackbits(codes, axis=1).astype(np.int64)
    return (u[:, None, :] != u[None, :, :]).sum(axis=2)


def _hamming_brute_force(codes, R, clients=None):
    """Per row: the R smallest Hamming distances to other samples (ties make ids ambiguous, distances are not)."""
    dist = _hamming(codes).astype(float)
    np.fill_diagonal(dist, np.inf)
    if clients is not None:
        dist[clients[:, None] == clients[None, :]] = np.inf
    return np.sort(dist, axis=1)[:, :R], dist


@pytest.mark.parametrize("exact_max", [10_000, 10])
def test_hamming_search_equals_brute_force(exact_max):
    codes = _bits(300)
    p = IndexParams(R=8, exact_max=exact_max, hnsw_ef_search=300)
    got, kind = label_neighbours(codes, np.zeros(300, int), p)
    assert kind == ("exact" if exact_max > 300 else "hnsw")
    assert not (got == np.arange(300)[:, None]).any()
    assert all(len(set(row)) == 8 for row in got.tolist())
    best, dist = _hamming_brute_force(codes, 8)
    found = np.sort(np.take_along_axis(dist, got, axis=1), axis=1)
    if kind == "exact":
        np.testing.assert_array_equal(found, best)  # the same distances as numpy's brute force
    else:
        assert (found == best).mean() > 0.95


def test_hamming_never_includes_self_even_with_duplicates():
    codes = np.concatenate([_bits(40)] * 3)  # every code three times: distance 0 to two others
    got, _ = label_neighbours(codes, np.zeros(120, int), IndexParams(R=4))
    assert not (got == np.arange(120)[:, None]).any()
    for i in range(120):
        assert {j for j in (i % 40, i % 40 + 40, i % 40 + 80) if j != i} <= set(got[i].tolist())


@pytest.mark.parametrize("exact_max", [10_000, 10])
def test_hamming_exclude_same_client(exact_max):
    codes = _bits(120, bits=128, seed=2)
    clients = np.repeat(np.arange(4), 30)
    p = IndexParams(R=5, same_client=False, exact_max=exact_max, hnsw_ef_search=200)
    got, _ = label_neighbours(codes, clients, p)
    assert (clients[got] != clients[:, None]).all()
    assert not (got == np.arange(120)[:, None]).any()
    if exact_max > 120:
        best, dist = _hamming_brute_force(codes, 5, clients)
        np.testing.assert_array_equal(np.sort(np.take_along_axis(dist, got, axis=1), axis=1), best)


def test_hamming_relations_stay_within_label():
    # codes cluster by label (each label a base code with a few flipped bits): neighbours share the label
    rng = np.random.default_rng(3)
    labels = np.tile(np.arange(4), 50)
    base = rng.integers(0, 2, (4, 256)).astype(np.uint8)
    flips = (rng.random((200, 256)) < 0.05).astype(np.uint8)
    codes = np.packbits(base[labels] ^ flips, axis=1)
    clients = np.repeat(np.arange(5), 40)
    rel, kinds = build_relations(codes, labels, clients, IndexParams(R=6))
    assert rel.shape == (200, 6) and set(kinds) == {0, 1, 2, 3}
    assert (labels[rel] == labels[:, None]).all()
    assert not (rel == np.arange(200)[:, None]).any()
    members = np.flatnonzero(labels == 2)
    best, dist = _hamming_brute_force(codes[members], 6)
    local = np.searchsorted(members, rel[members])
    np.testing.assert_array_equal(np.sort(np.take_along_axis(dist, local, axis=1), axis=1), best)


def test_hamming_on_real_simhash_codes_finds_same_label_neighbours(mnist):
    # end to end on real digits: simhash codes, Hamming search across labels agrees with brute force
    # and most neighbours share the label (the float path is unchanged: see the tests above)
    from pipeline.config import EncodeParams
    from pipeline.index.encoder import build_encoder, encode

    x, y = mnist.train_x[:300], mnist.train_y[:300]
    codes = encode(build_encoder(EncodeParams(encoder="simhash", bits=256), x.shape[1:], 0), x, 100)
    got, _ = label_neighbours(codes, np.zeros(300, int), IndexParams(R=5))
    best, dist = _hamming_brute_force(codes, 5)
    np.testing.assert_array_equal(np.sort(np.take_along_axis(dist, got, axis=1), axis=1), best)
    assert (y[got] == y[:, None]).mean() > 0.7
