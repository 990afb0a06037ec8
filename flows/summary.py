"""Print a short summary of what the stages produced (the end of `make run`)."""

from __future__ import annotations

import json

from pipeline import paths
from pipeline.cache.store import read_meta
from pipeline.config import load_params


def main() -> None:
    params = load_params()
    stats = json.loads(paths.PARTITION_STATS.read_text())
    info = json.loads(paths.HASHES_INFO.read_text())
    meta = read_meta(params.cache_db_path)
    s = stats["train_per_client"]
    print("\n== pipeline summary ==")
    print(f"partition : {params.data.dataset}, {stats['num_clients']} clients ({params.partition.scheme}), "
          f"{stats['num_train']} train / {stats['num_test']} test samples; per client min {s['min']} "
          f"mean {s['mean']:.1f} max {s['max']}  -> {paths.PARTITION_STATS}")
    print(f"encode    : {info['num_samples']} hashes, {info['dim']}-d {info['dtype']} ({info['encoder']}), "
          f"{info['images_per_second']:.0f} images/s  -> {paths.HASHES}")
    print(f"index     : R={meta['R']} neighbours per sample, same-client allowed: {meta['same_client']}, "
          f"index kinds {meta['index_kinds']}  -> {params.cache_db_path}")


if __name__ == "__main__":
    main()
