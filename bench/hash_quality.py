"""Hash quality and encoding throughput of each encoder on FashionMNIST's 60,000 training images.

Quality: for every sample, the fraction of its k=16 nearest neighbours (cosine over the
hash codes; Hamming distance over the packed sign bits of a binary code such as simhash;
across all labels, the sample itself excluded) that share its label; the table shows the
mean over all samples. Bytes: what one sample's code costs in the set-up upload (float16
for float codes, bits/8 for binary ones). Throughput: images encoded per second on this
machine's CPU (batch 512), the search excluded.

    .venv/bin/python bench/hash_quality.py [--limit N] [--encoders a,b,...]
    .venv/bin/python bench/hash_quality.py --encoders simhash      # the binary rows only
"""

from __future__ import annotations

import argparse
import time

import faiss
import numpy as np
import torch

from pipeline.config import EncodeParams
from pipeline.data.datasets import load_dataset
from pipeline.index.encoder import build_encoder, encode

CANDIDATES = {
    "hog": EncodeParams(encoder="hog"),
    "simhash (512 bits)": EncodeParams(encoder="simhash", bits=512),
    "simhash (1024 bits)": EncodeParams(encoder="simhash", bits=1024),
    "simhash (1024 bits, no centring)": EncodeParams(encoder="simhash", bits=1024, centre=0.0),
    "simhash (2048 bits)": EncodeParams(encoder="simhash", bits=2048),
    "random_conv (dim 256)": EncodeParams(encoder="random_conv", dim=256),
    "random_conv (dim 128)": EncodeParams(encoder="random_conv", dim=128),
    "random_projection (dim 256)": EncodeParams(encoder="random_projection", dim=256),
    "pixels (784)": EncodeParams(encoder="pixels"),
    "mobilenet_v3_small, random init, 32 px": EncodeParams(encoder="mobilenet_v3_small", image_size=32),
    "mobilenet_v3_small, random init, 64 px": EncodeParams(encoder="mobilenet_v3_small", image_size=64),
}


def knn_label_agreement(codes: np.ndarray, labels: np.ndarray, k: int = 16) -> float:
    if codes.dtype == np.uint8:  # packed sign bits: exact Hamming search
        x = np.ascontiguousarray(codes)
        index = faiss.IndexBinaryFlat(x.shape[1] * 8)
    else:
        x = np.ascontiguousarray(codes, dtype=np.float32)
        index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, ids = index.search(x, k + 1)
    own = np.arange(len(x))[:, None]
    keep = ids != own
    keep[keep.sum(axis=1) > k, -1] = False  # self not among the hits: keep the first k
    nbrs = ids[keep].reshape(len(x), k)
    return float((labels[nbrs] == labels[:, None]).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=None, help="use the first N training images only")
    ap.add_argument("--encoders", default=None, help="comma-separated subset of the table's rows (by prefix)")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    ds = load_dataset("fashion_mnist", "data/raw")
    x, y = ds.train_x[: args.limit], ds.train_y[: args.limit]
    print(f"FashionMNIST train images: {len(x)}; torch threads: {torch.get_num_threads()}")
    print("| encoder | dim | bytes per sample | 16-NN same-label fraction | images/s (CPU) |")
    print("|---|---|---|---|---|")
    for name, p in CANDIDATES.items():
        if args.encoders and not any(name.startswith(e) for e in args.encoders.split(",")):
            continue
        enc = build_encoder(p, x.shape[1:], seed=0)
        encode(enc, x[:512], p.batch_size)  # warm-up
        start = time.perf_counter()
        codes = encode(enc, x, p.batch_size, "float32")
        seconds = time.perf_counter() - start
        quality = knn_label_agreement(codes, y)
        binary = codes.dtype == np.uint8
        dim, nbytes = (codes.shape[1] * 8, codes.shape[1]) if binary else (codes.shape[1], 2 * codes.shape[1])
        print(f"| {name} | {dim} | {nbytes:,} | {quality:.4f} | {len(x) / seconds:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
