"""FedCache under the asynchronous schedule, through the real event loop (pipeline/train/schedules/async_.py), and the
byte ledger when devices drop out mid-update (issue 36, point 7).

The loop's own event log (events.jsonl) is the script: replaying it by hand, a client's download must be the
cache as the uploads that *arrived* before its start left it (read at the start), and each upload lands at its
arrival, stamped with the span it arrives in; the cache metrics of every span (coverage, staleness in spans,
teacher accuracy and entropy) are then written out from that replay. The ledger must hold exactly the downloads
and uploads the log shows completed: a dropped update's upload never.

Every sample's neighbours sit on other clients here (index.same_client: false): a client's teachers are then the
others' logits, so when it reads the cache and when they write it both show.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import duckdb
import numpy as np
import pytest
import torch

from conftest import make_workspace, with_section
from pipeline import paths
from pipeline.methods.fedcache.method import FedCache
from pipeline.train.schedules.async_ import EVENTS_FILE
from test_clock import _trainer


@pytest.fixture(scope="module")
def mnist(small_mnist):
    """14 x 14 digits (tests/conftest.py): these tests check what is computed, counted and when, not accuracy."""
    return small_mnist


@pytest.fixture
def workspace(tmp_path, monkeypatch, mnist):
    """tiny_workspace (3 MNIST clients of 30 samples, R = 3) with every sample's neighbours on other clients (an
    even label mix, Dirichlet alpha 100, so that every label has R samples on the other clients)."""
    monkeypatch.chdir(tmp_path)
    return make_workspace(tmp_path, mnist, {"partition": {"num_clients": 3, "samples_per_client": 30, "min_samples": 5,
                                                          "alpha": 100.0},
                                            "index": {"R": 3, "same_client": False}})


# three unequal devices (ms per sample, kbit/s): the clients' updates interleave; client 2 is the slowest
DEVICES = [(10, 20), (14, 25), (30, 12)]


def _async(params, tmp_path, span_s: float, rounds: int = 3, **devices):
    trace = tmp_path / "devices.csv"
    trace.write_text("client_id,computation,communication\n"
                     + "".join(f"{k + 1},{ms},{kbps}\n" for k, (ms, kbps) in enumerate(DEVICES)))
    params = with_section(params, "devices", enabled=True, trace=str(trace), **devices)
    params = with_section(params, "train", schedule="async", async_eval_s=span_s, rounds=rounds)
    return with_section(params, "fedcache", consistency="round")


def _events(run: str) -> list[dict]:
    return [json.loads(line) for line in (paths.RUNS / run / EVENTS_FILE).read_text().splitlines()]


def _spy(monkeypatch):
    """Record what FedCache's server half hands out at each start (configure with one client) and takes in at each
    arrival (arrive), in call order."""
    downloads, arrivals = [], []
    configure, arrive = FedCache.configure, FedCache.arrive

    def configure_spy(self, round_, selected):
        out = configure(self, round_, selected)
        for k in selected:
            [payload] = out[k]
            downloads.append((round_, k, payload.arrays["teacher"].clone()))
        return out

    def arrive_spy(self, round_, k, upload):
        [payload] = upload.payloads
        arrivals.append((round_, k, payload.arrays["sample_ids"].clone(), payload.arrays["logits"].clone()))
        return arrive(self, round_, k, upload)

    monkeypatch.setattr(FedCache, "configure", configure_spy)
    monkeypatch.setattr(FedCache, "arrive", arrive_spy)
    return downloads, arrivals


def _teacher(relations, latest: dict, i: int, C: int) -> list[float]:
    """Sample i's teacher by hand in float64: the mean of its known neighbours' latest logits (NaN: none known)."""
    known = [latest[j][0] for j in relations[i] if j in latest]
    if not known:
        return [math.nan] * C
    return [sum(float(row[c]) for row in known) / len(known) for c in range(C)]


def _stats(relations, latest: dict, span: int, labels, T: float, C: int) -> dict[str, float]:
    """KnowledgeCache.stats by hand, sample by sample, in float64 (ages in spans)."""
    covered = correct = pairs = 0
    ages = entropy = 0.0
    for i in range(len(relations)):
        known = [latest[j] for j in relations[i] if j in latest]
        if not known:
            continue
        covered, pairs = covered + 1, pairs + len(known)
        ages += sum(span - s for _, s in known)
        teacher = _teacher(relations, latest, i, C)
        correct += max(range(C), key=lambda c: teacher[c]) == int(labels[i])
        e = [math.exp(a / T) for a in teacher]
        entropy -= sum(q / sum(e) * math.log(q / sum(e)) for q in e)
    out = {"cache_coverage": covered / len(relations)}
    if covered:
        out.update(cache_staleness=ages / pairs, cache_teacher_acc=correct / covered, cache_teacher_entropy=entropy / covered)
    return out


def _cache_metrics(run: str) -> dict[int, dict[str, float]]:
    con = duckdb.connect(str(paths.RUNS / run / "run.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT round, name, value FROM round_metrics WHERE name LIKE 'cache_%'").fetchall()
    finally:
        con.close()
    out: dict[int, dict[str, float]] = {}
    for r, name, value in rows:
        out.setdefault(r, {})[name] = value
    return out


def _replay(events, downloads, arrivals, relations, ids_of, C: int, on_span_end=None):
    """Walk the event log in order with a hand-kept cache (sample -> (logits, span of arrival)): at each start,
    check the download the server half made against the cache; at each arrival, write the upload in. Returns
    the number of starts where another client's upload was in flight (trained, not yet arrived)."""
    latest: dict[int, tuple] = {}
    downloads, arrivals = list(downloads), list(arrivals)
    in_flight: set[int] = set()
    overlapping = 0
    spans = sorted({e["span"] for e in events})
    for span in range(1, max(spans) + 1):
        for e in (e for e in events if e["span"] == span):
            k = e["client"]
            if e["event"] == "start":
                r, kk, teacher = downloads.pop(0)
                assert (r, kk) == (span, k)
                expected = torch.tensor([_teacher(relations, latest, int(i), C) for i in ids_of(k)], dtype=torch.float64)
                where = f"span {span}, client {k} starting at t = {e['t']:.4f}"
                assert torch.isnan(teacher[:, 0]).tolist() == torch.isnan(expected[:, 0]).tolist(), where  # no teacher
                torch.testing.assert_close(teacher.double().nan_to_num(), expected.nan_to_num(), rtol=1e-6, atol=1e-6,
                                           msg=where)
                overlapping += bool(in_flight - {k})
            elif e["event"] == "trained":
                in_flight.add(k)
            elif e["event"] in ("arrived", "dropped"):
                in_flight.discard(k)
            if e["event"] == "arrived":
                _, kk, ids, logits = arrivals.pop(0)  # (the span it is stamped with shows in the cache metrics)
                assert kk == k
                latest.update({int(i): (row, span) for i, row in zip(ids.tolist(), logits.double())})
        if on_span_end is not None:
            on_span_end(span, latest)
    assert downloads == [] and arrivals == []  # one download per logged start, one arrival per logged arrival
    return overlapping


def test_async_fedcache_reads_the_cache_at_a_clients_start_and_writes_it_at_its_arrival(workspace, mnist, tmp_path,
                                                                                      monkeypatch):
    """Every download the server half made (the teachers of the client's samples) equals, to float32 rounding, the
    cache rebuilt by hand from the uploads whose `arrived` event precedes the client's `start` in the log, and
    nothing else; among those starts are some while another client's upload is in flight (trained, not yet
    arrived), so the instant of the write shows. Fails if an upload is written to the cache when it is trained
    (or sent) rather than when it arrives, if a dropped or unfinished upload reaches the cache, or if a download
    is made from another state of the cache than the one at its start (one download per logged start, in order)."""
    _, params, part = workspace
    downloads, arrivals = _spy(monkeypatch)
    trainer = _trainer(_async(params, tmp_path, span_s=4.0), part, mnist, "async-cache")
    trainer.run()
    events = _events("async-cache")
    relations = np.load(paths.RELATIONS).tolist()
    ids_of = trainer.server.ctx.client_sample_ids
    assert all(part.train_client()[j] != part.train_client()[i] for i in range(part.num_train) for j in relations[i])
    overlapping = _replay(events, downloads, arrivals, relations, ids_of, part.num_classes)
    assert overlapping >= 3  # the case that tells a write at arrival from one at training
    assert Counter(e["event"] for e in events)["arrived"] >= 6


def test_async_cache_staleness_counts_spans_since_each_neighbours_upload_arrived(workspace, mnist, tmp_path,
                                                                                 monkeypatch):
    """The cache metrics of every span in the results file (coverage, staleness, teacher accuracy, entropy) against
    the hand replay of the event log at the span's end: each neighbour's knowledge aged by the spans since the
    span its upload arrived in. Client 2's device is slow, so its knowledge ages while the others' stays fresh:
    the staleness is above 0 and moves. Fails if an arrival is stamped with anything but its span (e.g. the
    update's number, a sync round's meaning of `round`, or the span the update started in), or if the metrics
    are taken at another instant than the span's end."""
    _, params, part = workspace
    downloads, arrivals = _spy(monkeypatch)
    trainer = _trainer(_async(params, tmp_path, span_s=1.0, rounds=8), part, mnist, "async-stale")
    trainer.run()
    events = _events("async-stale")
    relations = np.load(paths.RELATIONS).tolist()
    metrics = _cache_metrics("async-stale")
    T, C = params.fedcache.T, part.num_classes
    expected = {}
    _replay(events, downloads, arrivals, relations, trainer.server.ctx.client_sample_ids, C,
            on_span_end=lambda span, latest: expected.__setitem__(span, _stats(relations, latest, span,
                                                                               part.train_labels, T, C)))
    assert sorted(metrics) == list(range(9)) and metrics[0] == {"cache_coverage": 0.0}
    for span in range(1, 9):
        assert metrics[span] == {k: pytest.approx(v, rel=1e-12, abs=1e-15) for k, v in expected[span].items()}, span
    staleness = [metrics[s].get("cache_staleness") for s in range(1, 9)]
    assert len({s for s in staleness if s is not None}) >= 3 and max(s or 0 for s in staleness) > 0.5, staleness


def test_the_ledger_counts_what_completed_when_devices_drop_out_mid_update(workspace, mnist, tmp_path):
    """Devices online and offline for 1 s on average: some updates are dropped after their download completed
    (during the training or the upload). Per span and client, the ledger's download bytes are the `downloaded`
    events x n_k * 4 * C and its upload bytes the `arrived` events x n_k * (8 + 4 * C), nothing else: a dropped
    update's download is counted, its upload never, and each row carries the instant of its last event. Fails
    if a dropped upload is counted (at training end, or when the connection drops), or a completed transfer is
    not, or one is counted in another span than the one it completed in."""
    _, params, part = workspace
    params = _async(params, tmp_path, span_s=2.0, rounds=4, online_mean_s=3.0, offline_mean_s=1.0)
    trainer = _trainer(params, part, mnist, "async-drops")
    trainer.run()
    events = _events("async-drops")
    C = part.num_classes
    n = {k: int(part.train_offsets[k + 1] - part.train_offsets[k]) for k in range(part.num_clients)}
    # the drops the docstring counts on: updates lost after their download completed, one of them during its upload
    # (trained before it dropped), and uploads that did arrive
    steps: dict[tuple[int, int], list[str]] = {}
    for e in events:
        steps.setdefault((e["client"], e["update"]), []).append(e["event"])
    lost = [s for s in steps.values() if "dropped" in s and "downloaded" in s]
    assert len(lost) >= 2 and any(s.index("trained") < s.index("dropped") for s in lost if "trained" in s), steps
    assert sum("arrived" in s for s in steps.values()) >= 2, steps
    con = duckdb.connect(str(paths.RUNS / "async-drops" / "run.duckdb"), read_only=True)
    rows = con.execute("SELECT round, client_id, direction, kind, bytes, sim_time_s FROM comm WHERE round > 0 "
                       "ORDER BY ALL").fetchall()
    totals = con.execute("SELECT round, bytes_up, bytes_down FROM rounds WHERE round > 0 ORDER BY round").fetchall()
    con.close()
    expected = []
    for (span, k, event), count in sorted(Counter((e["span"], e["client"], e["event"]) for e in events
                                                  if e["event"] in ("downloaded", "arrived")).items()):
        last = max(e["t"] for e in events if (e["span"], e["client"], e["event"]) == (span, k, event))
        if event == "downloaded":
            expected.append((span, k, "down", "knowledge", count * n[k] * 4 * C, pytest.approx(last, abs=1e-9)))
        else:
            expected.append((span, k, "up", "logits", count * n[k] * (8 + 4 * C), pytest.approx(last, abs=1e-9)))
    assert rows == sorted(expected, key=lambda r: r[:5])
    for span, up, down in totals:
        assert (up, down) == (sum(r[4] for r in rows if r[0] == span and r[2] == "up"),
                              sum(r[4] for r in rows if r[0] == span and r[2] == "down")), span
