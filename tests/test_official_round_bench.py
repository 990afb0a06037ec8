"""bench/official_round.py without the official code: the round timing read off its printed markers (a scripted
run on a fake clock), the FashionMNIST folder it builds for torchvision, and the table's speed-ups."""

import gzip
import io
import struct

import numpy as np

from bench.official_round import (
    PrintLog,
    fashion_mnist_dir,
    markdown,
    official_rounds,
    official_samples,
    ours_runs,
)


def scripted_run(log: PrintLog, clock: list[float]) -> None:
    """The official code's prints of a 2-round run (its format and spelling), the fake clock set before each."""
    def at(t: float, *args) -> None:
        clock[0] = t
        log(*args)

    for client, train, test in ((0, 3000, 500), (1, 4500, 740)):
        at(client, f"client_idx = {client}, batch_num_train_local = {train}, batch_num_test_local = {test}")
    at(5.0, "*********knowledge cache initialized successfully***************")
    for start, acc in ((10.0, 50.0), (60.0, 75.0)):
        at(start, "*********communication round", int(start // 60), "***************")
        at(start + 1, "*********start training on client", 0, "***************")
        at(start + 30, "*********start tesing on client", 0, "***************")
        at(start + 35, "mean Test/AccTop1 on client", 0, ":", acc - 1)
        at(start + 36, "*********start tesing on client", 1, "***************")
        at(start + 40, "mean Test/AccTop1 on all clients:", acc)


def test_rounds_are_timed_between_the_official_codes_own_markers():
    clock = [0.0]
    out = io.StringIO()
    log = PrintLog(clock=lambda: clock[0], stream=out)
    scripted_run(log, clock)
    rounds = official_rounds(log.lines, end=100.0)
    assert [(r["train_s"], r["eval_s"], r["total_s"], r["acc"]) for r in rounds] == [
        (30.0, 10.0, 40.0, 0.5), (30.0, 10.0, 40.0, 0.75)]
    assert "*********communication round 1 ***************\n" in out.getvalue()  # still printed, as print would
    assert official_samples(log.lines) == {"train_samples": 7500 * 8, "test_samples": 1240 * 8}


def test_a_round_that_evaluates_nothing_ends_where_the_next_starts():
    lines = [(0.0, "communication round 0"), (7.0, "communication round 1"), (9.0, "start tesing on client 0"),
             (10.0, "mean Test/AccTop1 on all clients: 80.0")]
    first, second = official_rounds(lines, end=10.0)
    assert (first["train_s"], first["eval_s"], first["acc"]) == (7.0, 0.0, None)
    assert (second["train_s"], second["eval_s"], second["total_s"]) == (2.0, 1.0, 3.0)


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of uint8 values: magic (0, 0, 0x08 = uint8, number of dimensions), the sizes, the data."""
    return bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def test_the_data_folder_is_torchvisions_fashion_mnist_layout(tmp_path):
    import torchvision

    gen = np.random.default_rng(0)
    arrays = {"train-images-idx3-ubyte": gen.integers(0, 256, (12, 28, 28), dtype=np.uint8),
              "train-labels-idx1-ubyte": gen.integers(0, 10, 12).astype(np.uint8),
              "t10k-images-idx3-ubyte": gen.integers(0, 256, (5, 28, 28), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": gen.integers(0, 10, 5).astype(np.uint8)}
    first, second = tmp_path / "debian", tmp_path / "raw"
    first.mkdir()
    second.mkdir()
    for i, (stem, array) in enumerate(arrays.items()):  # two gzipped in one source, two plain in the other
        if i % 2:
            (second / stem).write_bytes(idx_bytes(array))
        else:
            (first / f"{stem}.gz").write_bytes(gzip.compress(idx_bytes(array)))

    root = fashion_mnist_dir(tmp_path / "data", [first, second])
    assert sorted(p.name for p in (root / "FashionMNIST" / "raw").iterdir()) == sorted(arrays)
    train = torchvision.datasets.FashionMNIST(str(root), train=True, download=False)
    test = torchvision.datasets.FashionMNIST(str(root), train=False, download=False)
    assert np.array_equal(train.data.numpy(), arrays["train-images-idx3-ubyte"])
    assert np.array_equal(train.targets.numpy(), arrays["train-labels-idx1-ubyte"])
    assert np.array_equal(test.data.numpy(), arrays["t10k-images-idx3-ubyte"])
    assert np.array_equal(test.targets.numpy(), arrays["t10k-labels-idx1-ubyte"])


def test_the_table_sets_each_row_against_the_official_round():
    def row(name, rounds, acc):
        return {"row": name, "threads": 1, "train_samples": 60000, "test_samples": 10000,
                "rounds": [{"round": i + 1, "train_s": t, "eval_s": e, "total_s": t + e, "acc": acc}
                           for i, (t, e) in enumerate(rounds)]}

    header = {"date": "2026-01-01", "cpu": "a CPU", "load_start": "0.00", "load_end": "0.00", "setting": "demo",
              "threads": "1", "command": "python bench/official_round.py"}
    table = markdown(header, [row("official", [(270.0, 30.0), (280.0, 20.0)], 0.5),
                              row("ours, step (default)", [(90.0, 10.0), (70.0, 5.0)], 0.8)])
    ours = next(line for line in table.splitlines() if line.startswith("| ours"))
    assert "| **3.00x** / **4.00x** | **3.00x** / **4.00x** | 0.8000 |" in ours


def test_our_rows_are_the_default_then_round_float32_and_each_in_turn_where_groups_run_side_by_side():
    assert ours_runs("step", "float32", False) == [("step", "float32", False), ("round", "float32", False)]
    assert ours_runs("step", "bfloat16", False) == [("step", "bfloat16", False), ("round", "bfloat16", False),
                                                    ("step", "float32", False)]
    assert ours_runs("round", "float32", True) == [("round", "float32", False), ("round", "float32", True)]
    assert ours_runs("step", "bfloat16", True) == [("step", "bfloat16", False), ("round", "bfloat16", False),
                                                   ("step", "float32", False), ("step", "bfloat16", True),
                                                   ("round", "bfloat16", True)]
