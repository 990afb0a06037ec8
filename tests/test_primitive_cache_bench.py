"""oneDNN's primitive cache: the library's default capacity, and bench/primitive_cache.py's table and docs section
from made-up rows (never how fast anything is)."""

from __future__ import annotations

import json

from bench import primitive_cache
from pipeline.train.engine import PRIMITIVE_CACHE, keep_compiled_kernels


def test_the_engine_sets_the_capacity_unless_the_environment_does():
    name, value = PRIMITIVE_CACHE
    assert name == "ONEDNN_PRIMITIVE_CACHE_CAPACITY" and int(value) > 1024  # oneDNN's default: too few for a round
    unset, chosen = {}, {name: "123"}
    keep_compiled_kernels(unset)
    keep_compiled_kernels(chosen)
    assert unset == {name: value} and chosen == {name: "123"}


def made_up_result() -> dict:
    def run(capacity, round_s, eval_s, acc=(0.5, 0.6)):
        return {"capacity": capacity, "precision": "float32", "round_s": round_s, "eval_s": eval_s,
                "peak_mib": 1000.0 + capacity / 100, "acc": list(acc)}
    return {"header": {"cpu": "Made-up CPU", "kernels": "AVX2", "torch": "2.x", "threads": 2, "rounds": 5,
                       "repeats": 2, "date": "2026-01-01", "command": "python bench/primitive_cache.py"},
            "runs": [run(1024, 3.0, 2.0), run(4096, 1.0, 1.5), run(1024, 3.2, 2.2), run(4096, 1.2, 1.5, (0.5, 0.7))]}


def test_the_table_sets_each_capacity_against_the_default_and_checks_the_accuracies():
    lines = primitive_cache.table(made_up_result()).splitlines()
    (default,) = [x for x in lines if x.startswith("| float32 | 1024 (default) |")]
    assert default == "| float32 | 1024 (default) | 3.10 | 2.10 | 1.00x | 1010 | yes |"  # medians of the two
    (larger,) = [x for x in lines if x.startswith("| float32 | 4096 |")]
    assert larger == "| float32 | 4096 | 1.10 | 1.50 | 2.00x | 1041 | no |"  # 5.2 / 2.6; one run's accuracy moved


def test_the_docs_section_is_what_the_result_files_render(repo_root):
    text = (repo_root / "docs" / "executors.md").read_text()
    results = [json.loads(p.read_text())
               for p in sorted((repo_root / "bench" / "results").glob("primitive-cache-*.json"))]
    assert primitive_cache.render_docs(results, text) == text, \
        "stale: run .venv/bin/python bench/primitive_cache.py --docs"
