"""bench/eval_speed.py: its batched evaluation (the vectorized executor's before) gives each client the accuracy the
library's one-client-at-a-time evaluation gives, its table and docs section from made-up rows, and the docs page is
what the result files render; never how fast anything is."""

from __future__ import annotations

import json

import pytest
import torch

from bench import eval_speed
from conftest import tiny_params_raw
from pipeline.config import parse_params

HEADER = {"cpu": "Made-up CPU (family 1, model 2; AVX2, no AVX-512), 2 CPUs", "kernels": "AVX2", "torch": "2.x",
          "threads": 2, "repeats": 3, "clients": 4, "test_rows": 1000, "val_rows": 400, "date": "2026-01-01",
          "command": "python bench/eval_speed.py"}


def made_up_result() -> dict:
    def row(way, seconds, same=True):
        return {"precision": "float32", "way": way, "seconds": seconds, "same_acc": same, "mean_acc": 0.5}
    return {"header": HEADER, "rows": [row("one client at a time", [1.0, 3.0, 2.0]),
                                       row("one client at a time, no_grad", [2.0, 2.5, 3.0], same=False),
                                       row("batched across clients", [4.0, 5.0, 6.0])]}


def test_batched_evaluation_equals_one_client_after_another(mnist, float64):
    """Same-architecture clients in one grouped network, their test splits of different sizes, one of them empty:
    each client's own accuracy, as the library's evaluation (evaluate_model) gives it."""
    from models.resnet import build_model
    from pipeline.federation.clients import Client, evaluate_model, to_tensor

    params = parse_params(tiny_params_raw({"train": {"eval_batch_size": 16}}))
    clients = []
    for k, n_test in enumerate([37, 5, 0, 20]):
        torch.manual_seed(k)
        model = build_model("resnet8", 1, mnist.num_classes)
        with torch.no_grad():  # running statistics of their own: eval mode reads them
            for m in model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.normal_(0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        lo = 50 * k
        x, y = to_tensor(mnist.test_x[lo:lo + n_test]), torch.from_numpy(mnist.test_y[lo:lo + n_test]).long()
        clients.append(Client(k, model, torch.optim.SGD(model.parameters(), lr=0.1), x[:1], y[:1], torch.arange(1),
                              x, y, x[:0], y[:0]))
    batched = eval_speed.batched_accuracy(clients, params.train.eval_batch_size)
    for c in clients:
        acc, n = evaluate_model(c.model, c.x_test, c.y_test, 16)
        assert batched[c.id].n == n
        assert batched[c.id].acc["acc"] == pytest.approx(acc, nan_ok=True), c.id
    assert any(0 < batched[c.id].acc["acc"] < 1 for c in clients)  # not all trivially 0 or 1


def test_the_table_sets_each_way_against_the_batched_median_and_says_whether_it_agrees():
    lines = eval_speed.table(made_up_result()).splitlines()
    assert lines[0].startswith("Made-up CPU (family 1, model 2; AVX2, no AVX-512), 2 CPUs; kernels: AVX2;")
    (one,) = [x for x in lines if x.startswith("| float32 | one client at a time |")]
    assert one == "| float32 | one client at a time | 2.00 / 1.00 | 2.50x | 50.00% | yes |"  # median 5.0 over 2.0
    (no_grad,) = [x for x in lines if x.startswith("| float32 | one client at a time, no_grad |")]
    assert no_grad.endswith("| 2.00x | 50.00% | no |")


def test_docs_round_trip_keeps_the_rest_of_the_page():
    page = "# Executors\n\nText before.\n"
    first = eval_speed.render_docs([made_up_result()], page)
    assert first.startswith(page.rstrip() + "\n\n" + eval_speed.HEADING + "\n\n" + eval_speed.BEGIN)
    assert "### Made-up CPU (family 1, model 2; AVX2, no AVX-512), 2 CPUs (AVX2 kernels)" in first
    assert eval_speed.render_docs([made_up_result()], first) == first
    assert "Not measured yet." in eval_speed.render_docs([], first + "\n## Later\n")


def test_the_docs_section_is_what_the_result_files_render(repo_root):
    text = (repo_root / "docs" / "executors.md").read_text()
    results = [json.loads(p.read_text()) for p in sorted((repo_root / "bench" / "results").glob("eval-*.json"))]
    assert eval_speed.render_docs(results, text) == text, "stale: run .venv/bin/python bench/eval_speed.py --docs"
