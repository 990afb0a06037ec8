"""bench/threads_per_group.py on a tiny setting: that both ways train both groups and that the figures it prints
are consistent, never how fast either is."""

from __future__ import annotations

import pytest
import torch

from bench import threads_per_group as bench

pytestmark = pytest.mark.slow  # the bench tool's own steps (ResNet-8 groups, both ways): the end-to-end tier


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


def test_bfloat16_runs_each_forward_in_bfloat16_in_either_way():
    """autocast is per thread: the side-by-side threads enter it themselves, in each step."""
    seen = set()

    def hook(module, inputs, output):
        if "Conv" in type(module).__name__:
            seen.add(output.dtype)

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    threads = torch.get_num_threads()
    try:
        groups = [bench.Group("resnet8", 2, "bfloat16"), bench.Group("resnet8", 2, "bfloat16")]
        for way in (bench.in_turn, bench.side_by_side):
            seen.clear()
            way(groups, 1)
            assert seen == {torch.bfloat16}, way.__name__
    finally:
        handle.remove()
        torch.set_num_threads(threads)
