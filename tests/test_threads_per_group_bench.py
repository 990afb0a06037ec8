"""bench/threads_per_group.py on a tiny setting: that both ways train both groups and that the figures it prints
are consistent, never how fast either is."""

from __future__ import annotations

import pytest
import torch

from bench import threads_per_group as bench


def _weights(group: bench.Group) -> list[torch.Tensor]:
    return [p.detach().clone() for p in group.net.parameters()]


@pytest.mark.parametrize("way", [bench.in_turn, bench.side_by_side])
def test_each_way_steps_every_group(way):
    torch.manual_seed(0)
    groups = [bench.Group("resnet8", 2), bench.Group("resnet8", 2)]
    before = [_weights(g) for g in groups]
    threads = torch.get_num_threads()
    try:
        assert way(groups, 1) > 0
    finally:
        torch.set_num_threads(threads)
    for g, old in zip(groups, before):
        assert any(not torch.equal(p, q) for p, q in zip(_weights(g), old)), way.__name__  # the step ran


def test_the_row_is_the_measured_rates_and_the_thread_count_is_restored(capsys):
    threads = torch.get_num_threads()
    [row] = bench.main(["--models", "resnet8", "--clients", "2", "--steps", "1", "--repeats", "1"])
    assert torch.get_num_threads() == threads
    assert row["in_turn"] > 0 and row["side_by_side"] > 0
    assert row["ratio"] == pytest.approx(row["side_by_side"] / row["in_turn"])
    assert f"| resnet8 | {row['in_turn']:.0f} samples/s | {row['side_by_side']:.0f} samples/s | {row['ratio']:.2f}x |" \
        in capsys.readouterr().out
