"""The knowledge cache DB holds the right rows (samples/IH+LI, neighbours/IR, knowledge/IK)."""

import numpy as np
import pytest
from sqlalchemy import func, select

from pipeline.index import store


@pytest.fixture()
def cache(tmp_path):
    rng = np.random.default_rng(0)
    n, R, C = 40, 3, 5
    clients = np.repeat(np.arange(4), 10)
    local = np.tile(np.arange(10), 4)
    labels = rng.integers(0, C, n)
    codes = rng.normal(size=(n, 8)).astype(np.float16)
    relations = rng.integers(0, n, (n, R))
    path = tmp_path / "cache.db"
    store.create_cache(path, clients, local, labels, codes, relations, C, meta={"encoder": "test"})
    return path, clients, local, labels, codes, relations, C


def test_rows_round_trip(cache):
    path, clients, local, labels, codes, relations, C = cache
    s = store.read_samples(path)
    np.testing.assert_array_equal(s["client_id"], clients)
    np.testing.assert_array_equal(s["local_index"], local)
    np.testing.assert_array_equal(s["label"], labels)
    np.testing.assert_array_equal(s["hash"], codes)
    np.testing.assert_array_equal(store.read_relations(path), relations)
    logits, rounds = store.read_knowledge(path)
    assert logits.shape == (40, C) and not logits.any() and (rounds == -1).all()
    meta = store.read_meta(path)
    assert meta["R"] == "3" and meta["num_classes"] == "5" and meta["encoder"] == "test"
    assert meta["hash_dtype"] == "float16" and meta["hash_dim"] == "8"
    assert not path.with_name(path.name + ".tmp").exists()


def test_neighbour_rows_are_relational(cache):
    path, *_, relations, _ = cache
    engine = store.engine_for(path)
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(store.neighbours)).scalar_one()
        row = conn.execute(select(store.neighbours.c.neighbour_id)
                           .where(store.neighbours.c.sample_id == 7, store.neighbours.c.rank == 2)).scalar_one()
    engine.dispose()
    assert count == relations.size and row == relations[7, 2]


def test_write_knowledge_updates_only_given_samples(cache):
    path, *_, C = cache
    engine = store.engine_for(path)
    new = np.arange(3 * C, dtype=np.float32).reshape(3, C)
    store.write_knowledge(engine, np.array([4, 9, 30]), new, 2)
    engine.dispose()
    logits, rounds = store.read_knowledge(path)
    np.testing.assert_array_equal(logits[[4, 9, 30]], new)
    assert (rounds[[4, 9, 30]] == 2).all() and (np.delete(rounds, [4, 9, 30]) == -1).all()
    assert not np.delete(logits, [4, 9, 30], axis=0).any()


def test_missing_db_is_a_clear_error(tmp_path):
    with pytest.raises(store.CacheStoreError, match="dvc repro index"):
        store.read_relations(tmp_path / "absent.db")


def test_binary_hash_round_trip_and_meta(tmp_path):
    # simhash codes: uint8 packed sign bits, bits/8 bytes per row, stored as those raw bytes
    rng = np.random.default_rng(1)
    n, bits = 12, 64
    codes = rng.integers(0, 256, (n, bits // 8), dtype=np.uint8)
    path = tmp_path / "cache.db"
    store.create_cache(path, np.zeros(n, int), np.arange(n), np.zeros(n, int), codes,
                       rng.integers(0, n, (n, 2)), 3, meta={})
    meta = store.read_meta(path)
    assert meta["hash_format"] == "binary" and meta["hash_dim"] == str(bits)
    assert meta["hash_dtype"] == "uint8" and meta["hash_bytes"] == str(bits // 8)
    got = store.read_samples(path)["hash"]
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, codes)
    engine = store.engine_for(path)
    with engine.connect() as conn:
        blob = conn.execute(select(store.samples.c.hash).where(store.samples.c.sample_id == 5)).scalar_one()
    engine.dispose()
    assert blob == codes[5].tobytes() and len(blob) == bits // 8


def test_float_hash_meta(cache):
    meta = store.read_meta(cache[0])
    assert meta["hash_format"] == "float" and meta["hash_bytes"] == str(8 * 2)
