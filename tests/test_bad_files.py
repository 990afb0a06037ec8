"""Damaged or foreign input files get one clear message naming the file and the command that rebuilds it."""

import sqlite3

import numpy as np
import pytest

from pipeline import paths
from pipeline.index import store
from pipeline.index.hashes import load_hashes
from pipeline.config import ConfigError, load_params
from pipeline.errors import InputFileError
from pipeline.data.partition import Partition


def test_damaged_partition_file(tiny_workspace):
    paths.PARTITION.write_bytes(b"not a zip archive at all")
    with pytest.raises(InputFileError, match=r"data/partition/partition.npz is damaged.*dvc repro -f partition"):
        Partition.load(paths.PARTITION)


def test_foreign_partition_file(tiny_workspace):
    np.savez(paths.PARTITION, something_else=np.arange(3))
    with pytest.raises(InputFileError, match=r"partition.npz is damaged, from an older version \(no validation split\) or not a partition file.*KeyError"):
        Partition.load(paths.PARTITION)


def test_damaged_and_wrong_hashes(tiny_workspace):
    _, _, part = tiny_workspace
    assert load_hashes(paths.HASHES, part.num_train).shape[0] == part.num_train
    np.save(paths.HASHES, np.zeros((part.num_train + 1, 4), np.float16))
    with pytest.raises(InputFileError, match=r"hashes.npy holds .* expected one float row per training sample.*repro -f encode"):
        load_hashes(paths.HASHES, part.num_train)
    paths.HASHES.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(InputFileError, match=r"hashes.npy is damaged or not a hashes file.*dvc repro -f encode"):
        load_hashes(paths.HASHES, part.num_train)


def test_binary_hashes_accepted_and_wrong_ones_rejected(tiny_workspace):
    # simhash codes (uint8 packed sign bits) are valid; other integer dtypes, a wrong row count
    # or an empty row are not
    _, _, part = tiny_workspace
    n = part.num_train
    np.save(paths.HASHES, np.zeros((n, 128), np.uint8))
    assert load_hashes(paths.HASHES, n).shape == (n, 128)
    for bad in (np.zeros((n, 16), np.int64), np.zeros((n - 1, 16), np.uint8), np.zeros((n, 0), np.uint8),
                np.zeros(n * 16, np.uint8)):
        np.save(paths.HASHES, bad)
        with pytest.raises(InputFileError, match=r"hashes.npy holds .*uint8 row of packed sign bits.*repro -f encode"):
            load_hashes(paths.HASHES, n)
    with open(paths.HASHES, "r+b") as f:  # a truncated binary file
        np.save(f, np.zeros((n, 128), np.uint8))
        f.truncate(200)
    with pytest.raises(InputFileError, match=r"hashes.npy is damaged or not a hashes file.*dvc repro -f encode"):
        load_hashes(paths.HASHES, n)


def test_damaged_cache_db(tiny_workspace):
    _, params, _ = tiny_workspace
    db = params.cache_db_path
    db.write_bytes(b"SQLite format 3\x00" + b"\x00garbage" * 500)
    with pytest.raises(store.CacheStoreError, match=r"cache.db is damaged or not a knowledge-cache database.*repro -f index"):
        store.read_relations(db)


def test_foreign_sqlite_file_as_cache_db(tiny_workspace):
    _, params, _ = tiny_workspace
    db = params.cache_db_path
    db.unlink()
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE other (x INTEGER)")
    with pytest.raises(store.CacheStoreError, match=r"not a knowledge-cache database.*no such table"):
        store.read_relations(db)


def test_params_with_a_key_written_twice(write_params):
    path = write_params("seed: 0\ntrain:\n  rounds: 5\n  lr: 0.1\n  rounds: 7\n")
    with pytest.raises(ConfigError, match=r"params.yaml: key 'rounds' is written twice in one section \(lines 3 and 5\)"):
        load_params(path)
