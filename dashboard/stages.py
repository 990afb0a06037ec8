"""What the earlier stages left on disk, for the dashboard: the partition's label mix, the
knowledge cache's neighbour table (read-only SQLite), and run params. Pure functions, no
Streamlit; every missing input raises `InputMissing` with the command that makes it.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import paths
from pipeline.data import datasets
from pipeline.data.partition import Partition

CLASS_NAMES = {
    "fashion_mnist": datasets.FASHION_MNIST_CLASSES,
    "mnist": datasets.MNIST_CLASSES,
    "cifar10": datasets.CIFAR10_CLASSES,
}
DEFAULT_CACHE_DB = paths.CACHE_DIR / "cache.db"


class InputMissing(FileNotFoundError):
    """A stage output is not there; str(err) says which and how to make it."""


def class_names(dataset: str | None, num_classes: int) -> list[str]:
    names = CLASS_NAMES.get(dataset or "", ())
    return list(names) if len(names) == num_classes else [str(c) for c in range(num_classes)]


# ----------------------------------------------------------------------------- partition

def load_stats(path: Path) -> dict:
    if not Path(path).is_file():
        raise InputMissing(f"No partition stats at `{path}`: run the partition stage (`dvc repro partition`).")
    return json.loads(Path(path).read_text())


def label_mix(stats: dict, dataset: str | None = None) -> pd.DataFrame:
    """One row per (client, class): training count and the class's share of the client's data."""
    counts = np.asarray(stats["train_counts"], dtype=np.int64)
    K, C = counts.shape
    names = class_names(dataset, C)
    totals = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, totals, out=np.zeros(counts.shape), where=totals > 0)
    test = np.asarray(stats.get("test_counts", np.zeros_like(counts)), dtype=np.int64)
    return pd.DataFrame({
        "client_id": np.repeat(np.arange(K), C),
        "class_id": np.tile(np.arange(C), K),
        "class": np.tile(names, K),
        "count": counts.ravel(),
        "test_count": test.ravel(),
        "share": share.ravel(),
    })


def load_train_index(path: Path) -> np.ndarray:
    """Dataset index of every global sample id (the `train_index` of pipeline.data.partition.Partition, read by
    the pipeline's own loader, which loads no torch; a damaged file raises its InputFileError)."""
    if not Path(path).is_file():
        raise InputMissing(f"No partition at `{path}`: run the partition stage (`dvc repro partition`).")
    return Partition.load(path).train_index


# ----------------------------------------------------------------------------- knowledge cache

def cache_db_path(params: dict | None) -> Path:
    """The SQLite file of index.db_url ('sqlite:///data/cache/cache.db' -> data/cache/cache.db)."""
    url = ((params or {}).get("index") or {}).get("db_url") or ""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):])
    return DEFAULT_CACHE_DB


def _connect_ro(path: Path) -> sqlite3.Connection:
    if not Path(path).is_file():
        raise InputMissing(f"No knowledge cache at `{path}`: run the index stage (`dvc repro index`).")
    return sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=5)


def cache_overview(path: Path) -> dict[str, Any]:
    """cache_meta plus the sample count and the classes present."""
    con = _connect_ro(path)
    try:
        meta = dict(con.execute("SELECT key, value FROM cache_meta").fetchall())
        n = con.execute("SELECT count(*) FROM samples").fetchone()[0]
        labels = [r[0] for r in con.execute("SELECT DISTINCT label FROM samples ORDER BY label")]
    finally:
        con.close()
    return {"meta": meta, "num_samples": int(n), "labels": labels}


def pick_samples(path: Path, n: int, seed: int = 0, label: int | None = None) -> list[int]:
    """n sample ids, seeded: one per class in turn (Figure 3 shows different classes), or all of one class."""
    con = _connect_ro(path)
    try:
        rows = con.execute("SELECT sample_id, label FROM samples" + (" WHERE label = ?" if label is not None else ""),
                           [] if label is None else [label]).fetchall()
    finally:
        con.close()
    if not rows:
        return []
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    labels = np.array([r[1] for r in rows], dtype=np.int64)
    gen = np.random.default_rng(seed)
    order = gen.permutation(len(ids))
    ids, labels = ids[order], labels[order]
    classes = gen.permutation(np.unique(labels))
    firsts = [ids[labels == c] for c in classes]  # per class, seeded order
    picked: list[int] = []
    depth = 0
    while len(picked) < min(n, len(ids)):
        for per_class in firsts:
            if depth < len(per_class) and len(picked) < n:
                picked.append(int(per_class[depth]))
        depth += 1
    return picked


def neighbours(path: Path, sample_ids: list[int]) -> pd.DataFrame:
    """For each query sample: its R cached neighbours in rank order, with label and client of both.

    Columns: sample_id, rank (-1 = the query itself), member_id, label, client_id.
    """
    cols = ["sample_id", "rank", "member_id", "label", "client_id"]
    if not sample_ids:
        return pd.DataFrame(columns=cols)
    q = ", ".join("?" * len(sample_ids))
    con = _connect_ro(path)
    try:
        own = con.execute(f"SELECT sample_id, -1, sample_id, label, client_id FROM samples WHERE sample_id IN ({q})",
                          sample_ids).fetchall()
        nbs = con.execute(
            f"SELECT n.sample_id, n.rank, n.neighbour_id, s.label, s.client_id FROM neighbours n "
            f"JOIN samples s ON s.sample_id = n.neighbour_id WHERE n.sample_id IN ({q})", sample_ids).fetchall()
    finally:
        con.close()
    df = pd.DataFrame(own + nbs, columns=cols)
    order = {s: i for i, s in enumerate(sample_ids)}
    df["_o"] = df["sample_id"].map(order)
    return df.sort_values(["_o", "rank"]).drop(columns="_o").reset_index(drop=True)


def montage(images: np.ndarray, borders: list[tuple[int, int, int]], scale: int = 2, pad: int = 2,
            gap: int = 8) -> np.ndarray:
    """One RGB strip: images[0] (the query), a gap, then the neighbours, each framed in its colour.

    images: uint8 [n, H, W] or [n, H, W, 3]; borders: one RGB colour per image.
    """
    imgs = np.asarray(images)
    if imgs.ndim == 3:
        imgs = np.repeat(imgs[..., None], 3, axis=-1)
    imgs = imgs.repeat(scale, axis=1).repeat(scale, axis=2)
    n, h, w, _ = imgs.shape
    cell_h, cell_w = h + 2 * pad, w + 2 * pad
    out = np.full((cell_h, n * cell_w + gap + (n - 1) * 2, 3), 255, dtype=np.uint8)
    x = 0
    for i in range(n):
        out[:, x:x + cell_w] = borders[i]
        out[pad:pad + h, x + pad:x + pad + w] = imgs[i]
        x += cell_w + (gap if i == 0 else 2)
    return out
