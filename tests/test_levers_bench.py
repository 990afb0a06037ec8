"""bench/levers.py: its table and docs section from made-up rows, the docs round trip, and one tiny real lever run
end to end (the table and the JSON it writes), never how fast anything is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import levers

HEADER = {"cpu": "Made-up CPU (family 1, model 2; AVX2, no AVX-512), 2 CPUs",
          "bf16_flags": {"avx512_bf16": False, "amx_bf16": False}, "torch": "2.x", "threads": 2, "batch": 8,
          "rounds": 3, "date": "2026-01-01", "setting": "made-up K = 4", "command": "python bench/levers.py"}


def row(lever: str, setting: str, round_s: list[float], eval_s: list[float], acc: list[float], **extra) -> dict:
    return {"lever": lever, "setting": setting, "precision": "float32", "round_s": round_s, "eval_s": eval_s,
            "acc": acc, "n": [100, 100, 100, 100], **extra}


def made_up_result() -> dict:
    base = row("baseline", "params.yaml defaults", [9.0, 4.0, 6.0], [2.0, 2.0, 2.0], [0.5, 0.6, 0.7, 0.8])
    faster = row("group_size", "8 (groups of 8)", [8.0, 2.0, 3.0], [4.0, 4.0, 4.0], [0.5, 0.6, 0.7, 0.8])
    compiled = row("compile", "inductor", [60.0, 5.0, 5.0], [2.0, 1.0, 1.0], [0.6, 0.7, 0.8, 0.9],
                   compile_s=55.25, graphs=8, recompile_limit_hit=3)
    bf16 = row("precision", "bfloat16 autocast", [9.0, 5.0, 5.0], [2.0, 2.0, 2.0], [0.5, 0.6, 0.7, 0.8],
               precision="bfloat16")
    return {"header": HEADER, "rows": [base, faster, compiled, bf16],
            "absent": [{"lever": "loss", "why": "KD torch.compile'd: failed: boom"}],
            "startup": [{"what": "import torch", "seconds": [3.0, 1.0, 2.0], "dynamo": False},
                        {"what": "import flows.train", "seconds": [], "dynamo": False, "error": "ImportError: x"}]}


def line(text: str, start: str) -> str:
    (found,) = [x for x in text.splitlines() if x.startswith(start)]
    return found


def test_table_speed_ups_are_the_baselines_mean_of_rounds_2_to_n_over_the_levers():
    text = levers.table(made_up_result())
    base = line(text, "| baseline |")
    assert "| 9.00 | 4.00 / 5.00 | 2.00 / 2.00 |  | 1.00x / 1.00x | 65.00% | - |" in base
    group = line(text, "| group_size |")  # rounds 2..3 mean 2.5 against 5.0; evaluation 4.0 against 2.0
    assert "| 8.00 | 2.00 / 2.50 | 4.00 / 4.00 |  | 2.00x / 0.50x | 65.00% | +0.00 [+0.00, +0.00] |" in group


def test_table_names_compile_time_graphs_and_the_recompile_limit():
    compiled = line(levers.table(made_up_result()), "| compile |")
    assert "| 60.00 | 5.00 / 5.00 | 1.00 / 1.00 | 55.2 | 1.00x / 2.00x | 75.00% |" in compiled
    assert "| +10" in compiled  # every client 10 points up: the paired difference is exactly +10
    assert "8 graphs compiled, recompile limit hit 3x (eager after it)" in compiled


def test_table_says_what_is_absent_emulated_or_failed():
    text = levers.table(made_up_result())
    assert "no avx512_bf16/amx_bf16: bf16 is emulated" in line(text, "| precision |")
    assert line(text, "| loss |").startswith("| loss | KD torch.compile'd: failed: boom |")
    assert "| import torch | 2.00 | 3 | no |" in text  # the median of the three runs
    assert "| import flows.train | ImportError: x | 0 | no |" in text


def test_docs_round_trip_keeps_the_rest_of_the_page():
    page = "# Executors\n\nText before.\n"
    first = levers.render_docs([made_up_result()], page)
    assert first.startswith(page.rstrip() + "\n\n" + levers.DOCS_HEADING + "\n\n" + levers.BEGIN)
    assert first.rstrip().endswith(levers.END)
    assert "### Made-up CPU (family 1, model 2; AVX2, no AVX-512), 2 CPUs" in first
    assert "(avx512_bf16 no, amx_bf16 no); torch 2.x, 2 torch threads; made-up K = 4" in first
    assert levers.render_docs([made_up_result()], first) == first  # rendering again changes nothing
    later = first + "\n## A later section\n"
    empty = levers.render_docs([], later)
    assert "Not measured yet." in empty and "| baseline |" not in empty
    assert empty.endswith("\n## A later section\n") and empty.startswith(page.rstrip())


def test_write_docs_reads_every_result_file(tmp_path):
    results, docs = tmp_path / "results", tmp_path / "executors.md"
    results.mkdir()
    docs.write_text("# Executors\n")
    for cpu in ("a", "b"):
        result = made_up_result()
        result["header"] = {**HEADER, "cpu": f"CPU {cpu}"}
        (results / f"levers-{cpu}.json").write_text(json.dumps(result))
    levers.write_docs(results, docs)
    text = docs.read_text()
    assert text.index("### CPU a") < text.index("### CPU b")


def test_the_docs_section_is_what_the_result_files_render(repo_root):
    """docs/executors.md's lever figures come from bench/results/levers-*.json by `bench/levers.py --docs` (before the
    first measurement the page may have no lever section yet)."""
    text = (repo_root / "docs" / "executors.md").read_text()
    results = [json.loads(p.read_text()) for p in sorted((repo_root / "bench" / "results").glob("levers-*.json"))]
    if results or levers.BEGIN in text:
        assert levers.render_docs(results, text) == text, "stale: run .venv/bin/python bench/levers.py --docs"


def test_the_start_up_table_alone_replaces_only_the_start_up_rows(tmp_path, monkeypatch, capsys):
    path = tmp_path / "levers.json"
    path.write_text(json.dumps(made_up_result()))
    fresh = [{"what": "the exit after the training stage's imports", "seconds": [1.5], "dynamo": True}]
    monkeypatch.setattr(levers, "startup", lambda repeats: fresh)  # no interpreters started here
    assert levers.main(["--levers", "startup", "--json", str(path)]) == 0
    saved = json.loads(path.read_text())
    assert saved["rows"] == made_up_result()["rows"] and saved["header"] == HEADER  # the levers' run, kept
    assert saved["startup"] == fresh and "--levers startup" in saved["startup_measured"]
    assert "Start-up parts measured " in levers.table(saved)
    assert "| the exit after the training stage's imports | 1.50 | 1 | yes |" in levers.table(saved)


def test_the_start_up_parts_include_the_exit_with_and_without_a_frozen_heap():
    assert [what for what, _ in levers.EXITS] == ["the exit after the training stage's imports",
                                                  "the same exit, the heap frozen first (gc.freeze(), flows/cli.py)"]
    assert "gc.freeze()" in levers.EXITS[1][1] and levers.EXITS[0][1] == ""


@pytest.mark.slow  # child processes that import torch and train: the end-to-end tier
def test_one_tiny_lever_run_end_to_end(tmp_path, repo_root):
    out = tmp_path / "levers.json"
    run = subprocess.run([sys.executable, str(repo_root / "bench" / "levers.py"), "--levers", "channels_last",
                          "--rounds", "1", "--threads", "1", "--clients", "4", "--samples", "80", "--synthetic",
                          "--eval-rows", "8", "--json", str(out)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "| baseline | params.yaml: group 32," in run.stdout
    assert "| channels_last | NCHW training (the default before bffdbe6) |" in run.stdout
    assert "| channels_last | NHWC evaluation too |" in run.stdout

    saved = json.loads(out.read_text())
    assert "smoke K = 4 x 80 synthetic samples" in saved["header"]["setting"]
    assert saved["absent"] == [] and saved["startup"] == []
    base, nchw, nhwc = saved["rows"]
    assert [(r["lever"], r["layout"]) for r in saved["rows"]] == [
        ("baseline", "library"), ("channels_last", "nchw"), ("channels_last", "nhwc")]
    for r in (base, nchw, nhwc):
        assert r["threads"] == 1 and r["clients"] == 4 and len(r["round_s"]) == len(r["eval_s"]) == 1
        assert len(r["acc"]) == 4 and all(0 <= a <= 1 for a in r["acc"])
    assert nhwc["n"] == base["n"]  # the same partition and test rows: the accuracies pair by client


@pytest.mark.slow  # starts a real Prefect server (seconds)
def test_the_server_start_part_times_a_server_until_it_answers():
    row = levers.server_once()
    assert "error" not in row, row
    assert 0 < row["s"] < 180 and row["dynamo"] is False
