"""bench/scaling.py: its trend verdicts on made-up rows whose shape is known, the grid it plans, and one tiny real
cell end to end (the table, the lines and the JSON it writes), never how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import scaling

KS = (20, 100, 300)


def row(k: int, samples: int, round_s: float, server_s: float = 0.0, groups=None, rss: float = 1.0,
        method: str = "fedcache", models: str = "homo") -> dict:
    return {"method": method, "models": models, "K": k, "samples": samples, "round_s": round_s,
            "server_s": server_s, "s_per_sample": round_s / samples, "peak_rss_gib": rss, "setup_s": 1.0,
            "eval_s": None, "groups": groups}


def test_a_cost_proportional_to_the_samples_is_linear():
    verdict = scaling.trend([row(k, 200 * k, 0.002 * 200 * k) for k in KS])
    assert "linear in samples" in verdict and "not linear" not in verdict
    assert "x1.00" in verdict


def test_a_fixed_cost_per_round_makes_small_k_dearer_per_sample():
    verdict = scaling.trend([row(k, 200 * k, 5.0 + 0.001 * 200 * k) for k in KS])
    assert "not linear, sublinear" in verdict
    assert "a fixed 5.00 s per round" in verdict  # the fit's intercept, recovered exactly


def test_bigger_groups_are_named_when_per_sample_cost_falls():
    rows = [row(20, 4000, 12.0, groups=[20]), row(100, 20000, 40.0, groups=[32, 32, 32, 4]),
            row(300, 60000, 120.0, groups=[32] * 9 + [12])]
    verdict = scaling.trend(rows)
    assert "sublinear" in verdict and "bigger grouped networks (20 -> 30 clients per group" in verdict


def test_a_server_growing_faster_than_the_samples_is_named():
    rows = [row(k, 200 * k, 0.002 * 200 * k + 1e-7 * (200 * k) ** 2, server_s=1e-7 * (200 * k) ** 2) for k in KS]
    verdict = scaling.trend(rows)
    assert "not linear, superlinear" in verdict
    assert "the server half" in verdict and scaling.SERVER_WORK["fedcache"] in verdict


def test_rows_without_a_visible_cause_say_so():
    # dearer per sample at K=300, but no server part, no groups, no fixed cost and the same memory
    rows = [row(20, 4000, 4.0), row(300, 60000, 90.0)]
    assert "no cause visible" in scaling.trend(rows)


def test_one_k_has_no_trend():
    assert scaling.trend([row(20, 4000, 4.0)]) == "one K only: no trend"


def test_fedavg_hetero_is_skipped_with_its_reason():
    cells, skipped = scaling.plan((20, 100), ["homo", "hetero"], ["fedcache", "fedavg"])
    assert cells == [("fedcache", "homo", 20), ("fedcache", "homo", 100), ("fedcache", "hetero", 20),
                     ("fedcache", "hetero", 100), ("fedavg", "homo", 20), ("fedavg", "homo", 100)]
    assert len(skipped) == 1 and skipped[0].startswith("fedavg hetero: skipped")
    assert "averages model parameters" in skipped[0]  # FedAvg's own declaration (pipeline/methods/fedavg/params.py)


def test_the_paper_scale_cell_runs_once_more_in_the_default_step_consistency():
    """FedCache `step` (params.yaml's) keeps every group's network alive for the round: its paper-scale memory is
    measured too, once, and only where the grid has the paper-scale FedCache cell."""
    cells, _ = scaling.plan((20, 300), ["homo", "hetero"], ["fedcache"])
    assert cells[-1] == (scaling.STEP, "hetero", 300) and [c for c in cells if c[0] == scaling.STEP] == [cells[-1]]
    assert scaling.STEP not in {c[0] for c in scaling.plan((20, 300), ["homo"], ["fedcache", "fedavg"])[0]}
    assert scaling.STEP not in {c[0] for c in scaling.plan((20, 300), ["homo", "hetero"], ["fedavg"])[0]}


@pytest.mark.parametrize(("rss", "word"), [(3.2, "within 4 GiB"), (4.5, "over 4 GiB")])
def test_paper_check(rss, word):
    line = scaling.paper_check([row(300, 54000, 1.0, rss=rss, models="hetero")], 200)
    assert line == f"paper scale (K=300, hetero) fedcache peak RSS {rss:.2f} GiB: {word}"
    assert "at 20 samples per client, not 200" in scaling.paper_check([row(300, 6000, 1.0, models="hetero")], 20)
    assert scaling.paper_check([row(20, 4000, 1.0, models="hetero")], 200).endswith("not in this run")


@pytest.mark.slow  # child processes that import torch and train: the end-to-end tier
def test_one_tiny_cell_end_to_end(tmp_path, repo_root):
    out = tmp_path / "scaling.json"
    run = subprocess.run([sys.executable, str(repo_root / "bench" / "scaling.py"), "--ks", "20", "--models", "hetero",
                          "--methods", "fedcache", "fedavg", "--samples-per-client", "20", "--synthetic",
                          "--threads", "1", "--json", str(out)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    text = run.stdout
    assert text.startswith("# one round at K = 20, 20 samples per client")
    assert "| method | models | K | samples trained | round s | server s | s / client-sample | peak RSS GiB |" in text
    assert "| fedcache | hetero | 20 |" in text
    assert "- trend, fedcache hetero: one K only: no trend" in text
    assert "- fedavg hetero: skipped" in text
    assert "- paper scale (K=300, hetero): not in this run" in text

    saved = json.loads(out.read_text())
    assert saved["header"]["data"] == "synthetic" and saved["header"]["threads"] == 1
    assert saved["failed"] == [] and len(saved["skipped"]) == 1
    (cell,) = saved["rows"]
    assert (cell["method"], cell["models"], cell["K"], cell["threads"]) == ("fedcache", "hetero", 20, 1)
    assert cell["samples"] > 0 and len(cell["rounds_s"]) == 1
    assert cell["s_per_sample"] == pytest.approx(cell["round_s"] / cell["samples"])
    assert 0 <= cell["server_s"] <= cell["round_s"]
    assert cell["peak_rss_gib"] >= cell["setup_rss_gib"] > 0
    assert sum(cell["groups"]) == 20 and len(cell["groups"]) == 3  # one grouped network per architecture
