"""FedCache's pieces on constructed cases: the KD loss, and live vs round cache semantics."""

import math

import pytest
import torch

from pipeline.methods.fedcache.knowledge import KnowledgeCache
from pipeline.federation.losses import kd_rows


def kd_loss(student, teacher, T):
    """The batch's KD term as the executors reduce it: the rows' sum over the batch size."""
    return kd_rows(student, teacher, T).sum() / len(student)


def test_kd_loss_matches_hand_computation():
    student = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 0.0]])
    teacher = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 0.0]])
    T = 2.0

    def softmax(v):
        e = [math.exp(a / T) for a in v]
        return [a / sum(e) for a in e]

    total = 0.0
    for s, t in zip(student.tolist(), teacher.tolist()):
        ps, pt = softmax(s), softmax(t)
        total += sum(b * math.log(b / a) for a, b in zip(ps, pt))  # KL(teacher || student)
    expected = total / 2 * T * T
    assert kd_loss(student, teacher, T).item() == pytest.approx(expected, rel=1e-6)


def test_kd_loss_skips_rows_without_teacher():
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[0.0, 1.0], [float("nan"), float("nan")]])
    only_first = kd_loss(student[:1], teacher[:1], 1.0).item()
    # the NaN row adds nothing, but the batch size (2) still divides
    assert kd_loss(student, teacher, 1.0).item() == pytest.approx(only_first / 2)
    assert kd_loss(student, torch.full((2, 2), float("nan")), 1.0).item() == 0.0


def _cache(consistency, cold_start="skip"):
    # 4 samples; each one's neighbours are the two others of its pair group
    relations = torch.tensor([[1, 2], [0, 2], [0, 1], [0, 1]])
    return KnowledgeCache(relations, num_classes=2, consistency=consistency, cold_start=cold_start)


def test_live_sees_updates_at_once_round_sees_snapshot():
    live, snap = _cache("live"), _cache("round")
    for cache in (live, snap):
        cache.begin_round()
        cache.update(torch.tensor([0]), torch.tensor([[4.0, 0.0]]), 1)
        cache.update(torch.tensor([1]), torch.tensor([[0.0, 2.0]]), 1)
    # live: sample 2's neighbours (0 and 1) were just updated -> their mean
    torch.testing.assert_close(live.fetch(torch.tensor([2])), torch.tensor([[2.0, 1.0]]))
    # round: the snapshot at round start had no knowledge -> no teacher (NaN)
    assert torch.isnan(snap.fetch(torch.tensor([2]))).all()
    snap.begin_round()  # next round: last round's updates become visible
    torch.testing.assert_close(snap.fetch(torch.tensor([2])), torch.tensor([[2.0, 1.0]]))


def test_live_mean_uses_only_neighbours_with_knowledge():
    cache = _cache("live")
    cache.begin_round()
    cache.update(torch.tensor([0]), torch.tensor([[4.0, 0.0]]), 1)
    # sample 3's neighbours: 0 (known) and 1 (not yet): the mean is over the known one
    torch.testing.assert_close(cache.fetch(torch.tensor([3])), torch.tensor([[4.0, 0.0]]))


def test_zeros_cold_start_is_the_official_zero_init():
    cache = _cache("live", cold_start="zeros")
    cache.begin_round()
    cache.update(torch.tensor([0]), torch.tensor([[4.0, 0.0]]), 1)
    torch.testing.assert_close(cache.fetch(torch.tensor([3])), torch.tensor([[2.0, 0.0]]))  # (4+0)/2, (0+0)/2
    torch.testing.assert_close(cache.fetch(torch.tensor([2])), torch.tensor([[2.0, 0.0]]))


def test_state_round_trip():
    cache = _cache("round")
    cache.update(torch.tensor([0, 3]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 5)
    other = _cache("round")
    other.load_state_dict(cache.state_dict())
    torch.testing.assert_close(other.fetch(torch.tensor([1, 2])), cache.fetch(torch.tensor([1, 2])))
    assert other.updated_in.tolist() == [5, -1, -1, 5]
