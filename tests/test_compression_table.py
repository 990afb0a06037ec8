"""The bytes-accuracy table of encodings (pipeline/results/compression.py) and docs/compression.md's figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.results.compare import RunSeries
from pipeline.results.compression import (compression_rows, encoding_text, encodings, float32_twin,
                                          format_compression, goal_lines)

CLIENTS, ROUNDS = 20, 4


def _run(label: str, seed: int, acc: np.ndarray, bytes_per_round: int, setup: int = 0) -> RunSeries:
    """A run whose clients' accuracy at round r is acc[k] * r / ROUNDS (so its MAUA is the last round's mean)."""
    algorithm = label.partition(" (")[0]
    clients = [(r, k, float(acc[k] * r / ROUNDS), 500) for r in range(1, ROUNDS + 1) for k in range(CLIENTS)]
    rounds = [(0, None, setup, 0)] + [(r, float(np.mean(acc) * r / ROUNDS), bytes_per_round, bytes_per_round)
                                      for r in range(1, ROUNDS + 1)]
    return RunSeries(f"{label}-{seed}", algorithm, "homo", rounds, label=label, seed=seed, clients=clients)


def _plane() -> list[RunSeries]:
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(3):
        base = rng.uniform(0.55, 0.75, CLIENTS)
        noise = rng.normal(0, 0.002, CLIENTS)
        runs += [_run("fedcache (consistency=round)", seed, base, 1000, setup=400),
                 _run("fedcache (consistency=round, encode_up=int8, encode_down=int8)", seed, base + noise, 200, 400),
                 _run("fedcache (consistency=round, encode_up=argmax, encode_down=argmax)", seed, base - 0.1 + noise,
                      40, 400),
                 _run("fedavg", seed, base - 0.05, 100_000),
                 _run("fedavg (encode_up=int8, encode_down=int8)", seed, base - 0.05 + noise, 25_000)]
    return runs


def test_a_label_names_its_encodings_and_its_float32_twin():
    label = "fedcache (consistency=round, encode_up=int8, encode_down=delta:0.1+int8)"
    assert encodings(label) == {"up": "int8", "down": "delta:0.1+int8"}
    assert encoding_text(label) == "up int8, down delta:0.1+int8"
    assert encoding_text("fedcache (encode_up=int8, encode_down=int8)") == "int8"
    assert encoding_text("fedcache (consistency=round)") == "float32"
    assert float32_twin(label) == "fedcache (consistency=round)"
    assert float32_twin("fedavg (encode_up=int8, encode_down=int8)") == "fedavg"


def test_each_encoding_is_measured_against_its_own_method_in_float32():
    rows = {(r["algorithm"], r["encoding"]): r for r in compression_rows(_plane(), target=0.6)}
    int8, argmax = rows[("fedcache", "int8")], rows[("fedcache", "argmax")]
    assert int8["vs"] == "fedcache (consistency=round)" and rows[("fedavg", "int8")]["vs"] == "fedavg"
    assert int8["bytes_ratio"] == pytest.approx((400 + 4 * 400) / (400 + 4 * 2000))
    assert int8["bytes_ratio_training"] == pytest.approx(400 / 2000)
    assert int8["verdict"] == "tied" and int8["diff_low"] < 0 < int8["diff_high"]
    assert argmax["verdict"] == "behind" and argmax["diff"] == pytest.approx(-0.1, abs=0.002)
    assert rows[("fedcache", "float32")]["diff"] is None  # itself: no difference to show
    assert rows[("fedavg", "int8")]["bytes_ratio"] == pytest.approx(0.25)


def test_the_speed_up_is_fedavgs_bytes_to_its_level_over_the_runs():
    rows = {(r["algorithm"], r["encoding"]): r for r in compression_rows(_plane(), target=0.99)}
    # nobody reaches 0.99: the level is FedAvg's MAUA (its last round), which FedCache (5 points ahead of it at
    # every round) also reaches at its last round: 4 rounds of FedAvg's bytes over set-up plus 4 of FedCache's
    fedavg, fedcache = rows[("fedavg", "float32")], rows[("fedcache", "float32")]
    assert fedavg["speedup"] == pytest.approx(1.0) and fedavg["speedup_seeds"] == 3
    assert fedcache["speedup"] == pytest.approx(4 * 200_000 / (400 + 4 * 2000)) and fedcache["speedup_seeds"] == 3
    assert fedcache["speedup_no_setup"] == pytest.approx(4 * 200_000 / (4 * 2000))
    argmax = rows[("fedcache", "argmax")]  # 10 points below FedCache, 5 below FedAvg: never at FedAvg's level
    assert argmax["speedup"] is None and (argmax["speedup_seeds"], argmax["speedup_tried"]) == (0, 3)
    assert "| not reached (0 of 3) |" in format_compression([argmax])
    assert compression_rows(_plane(), target=None)[0]["speedup"] is None


def test_the_goal_lines_follow_the_rows():
    rows = compression_rows(_plane(), target=0.6)
    first, smallest = goal_lines(rows)
    assert "at most 1/4 of float32's bytes" in first
    assert "tied with float32 (the paired interval contains 0): int8" in first
    assert "argmax" in first and "behind" in first
    assert smallest.startswith("fedcache's smallest encoding, argmax") and "more than 1 point" in smallest
    table = format_compression(rows)
    assert table.count("\n") == len(rows) + 1 and "| fedcache | argmax | 3 |" in table



def test_docs_compression_md_is_what_its_generator_writes_from_the_result_file(repo_root):
    import importlib.util

    spec = importlib.util.spec_from_file_location("compression_bench", repo_root / "bench" / "compression.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = json.loads(bench.RESULTS.read_text())
    docs = bench.DOCS.read_text()
    regenerate = "run .venv/bin/python bench/compression.py docs"
    assert bench.BEGIN in docs, f"docs/compression.md has no measured section: {regenerate}"
    assert bench.render(result, docs) == docs, f"docs/compression.md is stale: {regenerate}"
    labels = {r["label"] for r in result["runs"]}
    assert any("encode_up=int8" in label for label in labels if label.startswith("fedcache"))
    assert any(label.startswith("fedavg (") and "int8" in label for label in labels)
