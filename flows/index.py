"""Stage 3: per label, the R nearest neighbours of every sample; initialise the knowledge cache DB."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

import flows  # noqa: F401
from prefect import flow, task

from flows.logs import log_progress
from pipeline import paths, progress
from pipeline.index.neighbours import build_relations, check_neighbours_fit, label_neighbours
from pipeline.index.hashes import load_hashes
from pipeline.index.store import create_cache
from pipeline.config import Params, load_params
from pipeline.data.partition import Partition


# One task per label (coarse: a label's search is one faiss call).
neighbours_of_label = task(label_neighbours, name="neighbours-of-label")


@task
def write_cache(part: Partition, codes: np.ndarray, relations: np.ndarray, params: Params, kinds: dict) -> None:
    create_cache(params.cache_db_path, part.train_client(), part.local_index(), part.train_labels, codes, relations,
                 part.num_classes, meta={"index_kinds": json.dumps(kinds), "same_client": str(params.index.same_client)})
    tmp = paths.RELATIONS.with_suffix(".tmp.npy")
    np.save(tmp, relations)
    tmp.replace(paths.RELATIONS)


@flow(name="index")
def index_flow(params_file: str = "params.yaml") -> dict:
    params = load_params(params_file, methods=())  # the shared sections: it runs no method
    part = Partition.load(paths.PARTITION)
    codes = load_hashes(paths.HASHES, part.num_train)
    labels, clients = part.train_labels, part.train_client()
    sizes = {int(c): int(n) for c, n in zip(*np.unique(labels, return_counts=True))}
    check_neighbours_fit(params.index.R, sizes)

    start = time.perf_counter()
    with progress.bar(len(sizes), "index", "label") as searched:
        def search(*args, **kwargs):
            found = neighbours_of_label(*args, **kwargs)
            searched.update(1)
            return found

        relations, kinds = build_relations(codes, labels, clients, params.index, search=search)
        log_progress(progress.state(searched))
    search_s = time.perf_counter() - start
    write_cache(part, codes, relations, params, kinds)
    same = float((labels[relations] == labels[:, None]).mean())
    summary = {"samples": part.num_train, "R": params.index.R, "search_seconds": round(search_s, 2),
               "seconds": round(time.perf_counter() - start, 2), "kinds": kinds, "same_label_fraction": same}
    print(f"index: {part.num_train} samples x R={params.index.R} neighbours "
          f"({', '.join(sorted(set(kinds.values())))} search, {search_s:.1f} s); "
          f"knowledge cache -> {params.cache_db_path} ({summary['seconds']:.1f} s in all)")
    return summary


if __name__ == "__main__":
    from flows.cli import run_stage

    sys.exit(run_stage(index_flow))
