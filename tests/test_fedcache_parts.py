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


def test_the_paper_presets_distil_as_the_official_code_does():
    """The official code (wuzhiyuan2000/FedCache): loss = CE + alpha * KL_Loss(student, teacher / args.T), with
    KL_Loss's own temperature 3.0: 3.0^2 * KLDiv(batchmean)(log_softmax(student / 3), softmax(teacher' / 3)
    + 1e-7), and args.T = 1. Written out here by hand, in float64, on a hand-made batch; every preset
    that runs FedCache must give the same term (up to the 1e-7 the official code adds to the teacher's
    probabilities, which moves it by less than 1e-4 of itself)."""
    from conftest import REPO_ROOT
    from pipeline.experiments import presets

    student = torch.tensor([[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0], [-1.0, 1.0, 0.0, 0.5]], dtype=torch.float64)
    teacher = torch.tensor([[1.5, 0.0, 0.2, -0.3], [0.0, 0.0, 2.0, 1.0], [0.3, 0.4, -0.5, 2.5]], dtype=torch.float64)
    args_T, kl_T, alpha = 1.0, 3.0, 1.5

    def official(eps: float) -> float:
        total = 0.0
        for s, t in zip(student.tolist(), (teacher / args_T).tolist()):
            log_q = [a / kl_T - math.log(sum(math.exp(b / kl_T) for b in s)) for a in s]
            p = [math.exp(a / kl_T) / sum(math.exp(b / kl_T) for b in t) + eps for a in t]
            total += sum(pi * (math.log(pi) - lq) for pi, lq in zip(p, log_q))  # KLDivLoss: p * (log p - input)
        return alpha * kl_T * kl_T * total / len(student)  # batchmean, then the T^2 factor and alpha

    assert official(1e-7) == pytest.approx(official(0.0), rel=1e-4)  # the official epsilon: a rounding detail

    for name in presets.available(REPO_ROOT / "presets"):
        flat = presets.check(name, REPO_ROOT / "params.yaml", REPO_ROOT / "presets")
        if "fedcache" not in flat.get("train.algorithms", []) + flat.get("train.hetero_algorithms", []):
            continue
        beta, T = flat.get("fedcache.beta", 1.5), flat.get("fedcache.T", 3.0)
        assert beta * kd_loss(student, teacher, T).item() == pytest.approx(official(0.0), rel=1e-12), name


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


def _entropy(logits, T):
    """Entropy (nats) of softmax(logits / T), by hand in float64."""
    e = [math.exp(a / T) for a in logits]
    p = [a / sum(e) for a in e]
    return -sum(q * math.log(q) for q in p)


def test_cache_stats_on_a_hand_built_cache():
    """5 samples, R = 2, 3 classes, at the end of round 4: sample 0 uploaded in round 1, sample 1 in round 3,
    the others never. Teachers: 0 <- {1} = (0,4,0); 1 <- {0} = (2,0,0); 2 <- {0,1} = (1,2,0); 3 <- {1} = (0,4,0);
    4 <- {2,3}: none known, no teacher."""
    relations = torch.tensor([[1, 2], [0, 2], [0, 1], [1, 4], [2, 3]])
    cache = KnowledgeCache(relations, num_classes=3, consistency="round")
    cache.update(torch.tensor([0]), torch.tensor([[2.0, 0.0, 0.0]]), 1)
    cache.update(torch.tensor([1]), torch.tensor([[0.0, 4.0, 0.0]]), 3)
    labels = torch.tensor([1, 0, 2, 1, 0])
    stats = cache.stats(4, labels, T=2.0)
    assert stats["cache_coverage"] == 4 / 5
    # every (sample, known neighbour) pair: ages 1 | 3 | 3, 1 | 1 -> 9 / 5 (a mean per sample first would be 7 / 4)
    assert stats["cache_staleness"] == 9 / 5
    assert stats["cache_teacher_acc"] == 3 / 4  # argmax 1, 0, 1, 1 against labels 1, 0, 2, 1
    expected = (2 * _entropy([0, 4, 0], 2.0) + _entropy([2, 0, 0], 2.0) + _entropy([1, 2, 0], 2.0)) / 4
    assert stats["cache_teacher_entropy"] == pytest.approx(expected, rel=1e-12, abs=0)
    # the stats read the live cache, not the round-start snapshot fetch() reads under `round`
    cache.begin_round()
    cache.update(torch.tensor([2, 3, 4]), torch.tensor([[0.0, 0.0, 1.0]] * 3), 5)
    assert cache.stats(5, labels, T=2.0)["cache_coverage"] == 1.0
    assert "cache_teacher_acc" not in cache.stats(5, None, T=2.0)  # no labels: no accuracy


def test_cache_stats_of_an_empty_and_of_a_zero_initialised_cache():
    relations = torch.tensor([[1, 2], [0, 2], [0, 1], [1, 4], [2, 3]])
    labels = torch.tensor([1, 0, 2, 1, 0])
    empty = KnowledgeCache(relations, num_classes=3, cold_start="skip")
    assert empty.stats(0, labels, T=3.0) == {"cache_coverage": 0.0}  # no teacher: nothing else is defined
    zeros = KnowledgeCache(relations, num_classes=3, cold_start="zeros")
    stats = zeros.stats(2, labels, T=3.0)
    # the paper's zero vectors count as knowledge of round 0; an all-zero teacher is uniform and its argmax class 0
    assert stats == {"cache_coverage": 1.0, "cache_staleness": 2.0, "cache_teacher_acc": 2 / 5,
                     "cache_teacher_entropy": pytest.approx(math.log(3), rel=1e-12, abs=0)}


def _stats_by_hand(relations, latest: dict, round_: int, labels, T: float, C: int) -> dict[str, float]:
    """KnowledgeCache.stats written out sample by sample in float64: `latest` maps a sample id to (its latest
    uploaded logits, the round of that upload)."""
    covered = correct = pairs = 0
    ages = entropies = 0.0
    for i, nbrs in enumerate(relations.tolist()):
        known = [latest[j] for j in nbrs if j in latest]
        if not known:
            continue
        covered += 1
        pairs += len(known)
        ages += sum(round_ - r for _, r in known)
        teacher = [sum(float(logits[c]) for logits, _ in known) / len(known) for c in range(C)]
        correct += max(range(C), key=lambda c: teacher[c]) == int(labels[i])
        entropies += _entropy(teacher, T)
    out = {"cache_coverage": covered / len(relations)}
    if covered:
        out.update(cache_staleness=ages / pairs, cache_teacher_acc=correct / covered,
                   cache_teacher_entropy=entropies / covered)
    return out


def test_a_fedcache_run_records_the_cache_stats_each_round(tiny_workspace, mnist, monkeypatch):
    """A real run of 3 rounds, 2 of the 3 clients a round (clients 0 and 1 in round 1, then 1 and 2 twice), so
    ages differ: every round's four cache metrics in the results file against the cache rebuilt here from the
    uploads the server received (each sample's latest logits and their round), over the index's relations and
    the partition's labels, in float64. (With every client in every round the staleness is 0 by definition:
    the metrics are taken after the round's uploads are folded in.) Fails if an upload is not written to the
    cache or stamped with another round (e.g. every sample restamped on each write: staleness flat at 0), if the
    teachers average other neighbours, or if the metrics read the round-start snapshot instead of the cache."""
    import duckdb
    import numpy as np

    from conftest import tiny, with_section
    from pipeline import paths
    from pipeline.methods.fedcache.method import FedCache
    from pipeline.methods.registry import REGISTRY
    from pipeline.results.store import RunResultsDB
    from pipeline.train.engine import Trainer

    _, params, part = tiny_workspace
    params = with_section(tiny(params, "fedcache"), "train", rounds=3, participation=0.67)
    received = []  # (round, sample ids, logits) of every upload the server folded in
    aggregate = FedCache.aggregate

    def spy(self, round_, uploads):
        for up in uploads.values():
            for p in up.payloads:
                received.append((round_, p.arrays["sample_ids"].clone(), p.arrays["logits"].clone()))
        return aggregate(self, round_, uploads)

    monkeypatch.setattr(FedCache, "aggregate", spy)
    trainer = Trainer(params, REGISTRY["fedcache"], part, mnist, paths.run_dir("fedcache"),
                      paths.checkpoint_path("fedcache"), RunResultsDB(paths.run_results("fedcache")), [paths.PARTITION])
    summary = trainer.run()
    con = duckdb.connect(str(paths.run_results("fedcache")), read_only=True)
    rows = con.execute("SELECT round, name, value FROM round_metrics WHERE run_id = ? AND name LIKE 'cache_%' "
                       "ORDER BY ALL", [summary["run_id"]]).fetchall()
    con.close()
    metrics = {r: {name: v for rr, name, v in rows if rr == r} for r in range(4)}
    assert sorted({r for r, _, _ in rows}) == [0, 1, 2, 3]
    assert metrics[0] == {"cache_coverage": 0.0}  # set-up: nothing cached yet
    owners = {r: sorted({int(part.train_client()[int(ids[0])]) for rr, ids, _ in received if rr == r})
              for r in (1, 2, 3)}
    assert owners == {1: [0, 1], 2: [1, 2], 3: [1, 2]}  # the seeded draws the docstring counts on
    relations, labels = np.load(paths.RELATIONS), part.train_labels
    latest: dict[int, tuple] = {}
    for r in (1, 2, 3):
        for rr, ids, logits in received:
            if rr == r:
                latest.update({int(i): (row, r) for i, row in zip(ids.tolist(), logits.double())})
        expected = _stats_by_hand(relations, latest, r, labels, params.fedcache.T, part.num_classes)
        assert metrics[r] == {k: pytest.approx(v, rel=1e-12, abs=1e-15) for k, v in expected.items()}, r
    assert metrics[2]["cache_staleness"] > 0 and metrics[3]["cache_staleness"] > metrics[2]["cache_staleness"]
    # the teacher accuracy is the clients' teachers (fetch) against the labels of the set-up upload
    server = trainer.server
    server.cache.begin_round()  # fetch() under `round` reads the snapshot: take it of the final cache
    teachers = server.cache.fetch(torch.arange(part.num_train))
    labels = torch.from_numpy(part.train_labels)
    assert torch.equal(server.labels, labels)
    assert torch.equal(server.state_dict()["labels"], labels)  # kept in the checkpoint for a resumed run
    has = ~torch.isnan(teachers[:, 0])
    assert metrics[3]["cache_teacher_acc"] == pytest.approx((teachers[has].argmax(1) == labels[has]).double().mean().item())
