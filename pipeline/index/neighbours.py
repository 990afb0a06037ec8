"""Per-label R nearest neighbours of every sample by similarity of hash codes.

FedCache eq. (10)-(11): a sample's neighbours are the R samples of the same label whose
hashes are most similar to its own, the sample itself excluded. Float codes are
L2-normalised, so inner product is cosine; binary codes (uint8, packed sign bits, the
simhash encoder) are compared by Hamming distance. Each label is searched on its own:
exact (faiss IndexFlatIP / IndexBinaryFlat) up to `exact_max` samples, HNSW above it
(IndexHNSWFlat / IndexBinaryHNSW), as the paper does at scale.
"""

from __future__ import annotations

import faiss
import numpy as np

from pipeline.config import IndexParams
from pipeline.errors import ConfigError, UserError


class NeighbourError(UserError, ValueError):
    pass


def check_neighbours_fit(R: int, class_sizes: dict[int, int]) -> None:
    """Before any output: R same-label neighbours exist for every sample (R below the smallest
    class's sample count, after partitioning)."""
    smallest_label, smallest = min(class_sizes.items(), key=lambda kv: kv[1])
    if R >= smallest:
        raise ConfigError(
            f"index.R = {R}: must be smaller than the smallest class "
            f"(label {smallest_label} has {smallest} samples, so R <= {smallest - 1})"
        )


def _build_index(codes: np.ndarray, p: IndexParams) -> tuple[faiss.Index, str]:
    if codes.dtype == np.uint8:  # packed sign bits: Hamming distance
        bits = codes.shape[1] * 8
        if len(codes) <= p.exact_max:
            index, kind = faiss.IndexBinaryFlat(bits), "exact"
        else:
            index, kind = faiss.IndexBinaryHNSW(bits, p.hnsw_m), "hnsw"
            index.hnsw.efConstruction = p.hnsw_ef_construction
        index.add(codes)
        return index, kind
    d = codes.shape[1]
    if len(codes) <= p.exact_max:
        index = faiss.IndexFlatIP(d)
        kind = "exact"
    else:
        index = faiss.IndexHNSWFlat(d, p.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = p.hnsw_ef_construction
        kind = "hnsw"
    index.add(codes)
    return index, kind


def _search_params(kind: str, p: IndexParams, selector: faiss.IDSelector | None):
    if kind == "hnsw":
        sp = faiss.SearchParametersHNSW()
        sp.efSearch = max(p.hnsw_ef_search, p.R + 1)
    else:
        sp = faiss.SearchParameters()
    if selector is not None:
        sp.sel = selector
    return sp


def _drop_self(ids: np.ndarray, self_pos: np.ndarray, R: int) -> np.ndarray:
    """From R+1 candidates per row, drop the query's own position wherever it appears.

    Exact duplicates can rank the sample itself anywhere (or not at all) among ties, so we
    filter by identity instead of dropping the first hit. Rows where the query is absent
    keep their first R candidates. Missing hits (-1, possible with HNSW) are an error.
    """
    keep = ids != self_pos[:, None]
    # rows without the query in the candidates: keep the first R only
    extra = keep.sum(axis=1) > R
    keep[extra, -1] = False
    # a -1 among the R kept means the search returned too few results
    out = ids[keep].reshape(len(ids), R)
    if (out < 0).any():
        raise NeighbourError("the neighbour search returned fewer than R hits for some samples; raise index.hnsw_ef_search")
    return out


def label_neighbours(codes: np.ndarray, clients: np.ndarray, p: IndexParams) -> tuple[np.ndarray, str]:
    """Neighbours among one label's samples. Returns (positions [n, R] into `codes`, index kind).

    `clients` (sorted ascending, as the partition orders samples) is used when
    `same_client` is false: each client's queries then search with its own samples masked
    out through a faiss ID selector (they form one contiguous range of positions).
    uint8 codes are packed sign bits (Hamming distance); any float codes are cosine.
    """
    n, R = len(codes), p.R
    codes = np.ascontiguousarray(codes, dtype=np.uint8 if codes.dtype == np.uint8 else np.float32)
    index, kind = _build_index(codes, p)
    if p.same_client:
        if R >= n:
            raise NeighbourError(f"index.R = {R} needs more than R samples per label; this label has {n}")
        _, ids = index.search(codes, R + 1, params=_search_params(kind, p, None))
        return _drop_self(ids, np.arange(n), R), kind

    out = np.empty((n, R), dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, clients[1:] != clients[:-1]])
    ends = np.r_[starts[1:], n]
    for lo, hi in zip(starts, ends):
        if n - (hi - lo) < R:
            raise NeighbourError(
                f"index.same_client = false: client {int(clients[lo])} holds {hi - lo} of this label's {n} samples, "
                f"leaving fewer than R = {R} candidates from other clients; lower index.R or allow same-client neighbours"
            )
        selector = faiss.IDSelectorNot(faiss.IDSelectorRange(int(lo), int(hi)))
        _, ids = index.search(codes[lo:hi], R, params=_search_params(kind, p, selector))
        if (ids < 0).any():
            raise NeighbourError("the neighbour search returned fewer than R hits; raise index.hnsw_ef_search")
        out[lo:hi] = ids
    return out, kind


def build_relations(codes: np.ndarray, labels: np.ndarray, clients: np.ndarray, p: IndexParams,
                    search=None) -> tuple[np.ndarray, dict[int, str]]:
    """Relation table [N, R] of global sample ids (FedCache's IR map), plus each label's index kind.

    `search` defaults to `label_neighbours`; the index flow passes it wrapped as a Prefect
    task so each label is one task.
    """
    search = search or label_neighbours
    relations = np.empty((len(codes), p.R), dtype=np.int64)
    kinds = {}
    for label in np.unique(labels).tolist():
        members = np.flatnonzero(labels == label)  # ascending global ids, so clients are sorted
        local, kinds[label] = search(codes[members], clients[members], p)
        relations[members] = members[local]
    return relations, kinds
