"""Print a short summary of what the stages produced (the end of `make run`)."""

from __future__ import annotations

import json

from flows import imports_done
from pipeline import paths
from pipeline.index.store import read_meta
from pipeline.config import load_params


def main() -> None:
    imports_done()  # flows/__init__.py paused the collector for `python -m` imports
    params = load_params(methods=())
    stats = json.loads(paths.PARTITION_STATS.read_text())
    info = json.loads(paths.HASHES_INFO.read_text())
    meta = read_meta(params.cache_db_path)
    s = stats["train_per_client"]
    print("\n== pipeline summary ==")
    print(f"partition : {params.data.dataset}, {stats['num_clients']} clients ({params.partition.scheme}), "
          f"{stats['num_train']:,} train / {stats.get('num_val', 0):,} validation / {stats['num_test']:,} test "
          f"samples; train per client min {s['min']} mean {s['mean']:.1f} max {s['max']}  -> {paths.PARTITION_STATS}")
    print(f"encode    : {info['num_samples']} hashes, {info['dim']}-d {info['dtype']} ({info['encoder']}), "
          f"{info['images_per_second']:.0f} images/s  -> {paths.HASHES}")
    kinds = sorted(set(json.loads(meta["index_kinds"]).values()))
    print(f"index     : R={meta['R']} neighbours per sample ({'/'.join(kinds)} search), same-client allowed: "
          f"{meta['same_client']}  -> {params.cache_db_path}")
    table = paths.REPORT_DIR / "comparison.md"
    if table.exists():
        print(f"training  : {params.train.rounds} rounds, results in {paths.RUNS}/<name>/{paths.RUN_RESULTS} "
              f"(index: {paths.RESULTS_DB}), plot in "
              f"{paths.REPORT_DIR / 'accuracy_vs_bytes.png'}\n")
        print(table.read_text())


if __name__ == "__main__":
    main()
