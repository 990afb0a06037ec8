"""Stage 2: every client hashes its own samples with the fixed encoder (one task per client)."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import flows  # noqa: F401
from prefect import flow, task

from flows.logs import log_progress
from pipeline import paths, progress
from pipeline.config import Params, load_params
from pipeline.data.datasets import load_dataset
from pipeline.torch_device import resolve_device
from pipeline.index.encoder import build_encoder, encode
from pipeline.data.partition import Partition


@task
def encode_client(encoder, images: np.ndarray, params: Params, device) -> np.ndarray:
    # The client sees only its own images; the encoder is shared and fixed.
    return encode(encoder, images, params.encode.batch_size, params.encode.dtype, device)


@flow(name="encode")
def encode_flow(params_file: str = "params.yaml") -> dict:
    params = load_params(params_file, methods=())  # the shared sections: it runs no method
    part = Partition.load(paths.PARTITION)
    ds = load_dataset(params.data.dataset, params.data.root, params.data.download)
    device = resolve_device(params.device)
    encoder = build_encoder(params.encode, ds.train_x.shape[1:], params.seed)
    start = time.perf_counter()
    codes = []
    with progress.bar(part.num_clients, "encode", "client") as encoded:
        for k in range(part.num_clients):
            codes.append(encode_client(encoder, ds.train_x[part.client_train(k)], params, device))
            encoded.update(1)
        log_progress(progress.state(encoded))
    codes = np.concatenate(codes)  # ordered by global sample id (clients one after another)
    seconds = time.perf_counter() - start
    paths.HASHES.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths.HASHES.with_suffix(".tmp.npy")
    np.save(tmp, codes)
    tmp.replace(paths.HASHES)
    binary = codes.dtype == np.uint8  # packed sign bits: dim counts bits, a row holds dim/8 bytes
    info = {"encoder": params.encode.encoder, "num_samples": int(codes.shape[0]),
            "dim": int(codes.shape[1]) * (8 if binary else 1), "dtype": "bit" if binary else str(codes.dtype),
            "bytes_per_sample": int(codes.shape[1] * codes.dtype.itemsize), "seconds": round(seconds, 3),
            "images_per_second": round(codes.shape[0] / max(seconds, 1e-9), 1), "device": str(device)}
    paths.HASHES_INFO.write_text(json.dumps(info, indent=1))
    print(f"encode: {info['num_samples']} samples -> {info['dim']}-d {info['dtype']} codes "
          f"({info['bytes_per_sample']} bytes each) with {info['encoder']} "
          f"in {seconds:.1f} s ({info['images_per_second']:.0f} images/s on {device})")
    return info


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(encode_flow))
