"""docs/speed.md is what the speed benches' result files render (bench/speed_docs.py): no figure typed by hand."""

from __future__ import annotations

import json

from bench import speed_docs
from bench.docs_section import replace_section

OFFICIAL = {"date": "2026-01-01", "cpu": "Made-up CPU, 2 CPUs", "load_start": "0.10", "load_end": "0.20",
            "setting": "the demo", "threads": "2", "command": "python bench/official_round.py",
            "rows": [{"row": "official", "threads": 2, "train_samples": 59936, "test_samples": 9928,
                      "rounds": [{"train_s": 240.0, "eval_s": 12.0, "total_s": 252.0, "acc": 0.78}]},
                     {"row": "ours, step (default)", "threads": 2, "train_samples": 60000, "test_samples": 10000,
                      "rounds": [{"train_s": 100.0, "eval_s": 5.0, "total_s": 105.0, "acc": 0.79}]}]}
SCALING = {"header": {"cpu": "Made-up CPU, 2 CPUs", "threads": 2, "batch": 8, "executor": "vectorized",
                      "group_size": 32, "rounds": 1, "samples_per_client": 200, "date": "2026-01-01",
                      "command": "python bench/scaling.py", "data": "FashionMNIST"},
           "rows": [{"method": "fedcache", "models": "homo", "K": 20, "samples": 4000, "round_s": 4.4, "server_s": 0.1,
                     "s_per_sample": 0.0011, "peak_rss_gib": 1.02, "setup_s": 6.0, "groups": [20]}],
           "trends": {"fedcache homo": "one K: no trend"}, "skipped": ["fedavg hetero: averages model parameters"],
           "check": "paper scale (K=300, hetero) not measured"}


def test_the_page_is_what_the_result_files_render():
    assert speed_docs.main(["--check"]) == 0, "run .venv/bin/python bench/speed_docs.py"


def test_figures_come_from_the_files(tmp_path):
    (tmp_path / "official-round-made-up.json").write_text(json.dumps(OFFICIAL))
    (tmp_path / "scaling-made-up.json").write_text(json.dumps(SCALING))
    page = speed_docs.render("# Speed\n", tmp_path)
    assert "**2.40x**" in page  # the official round's total over ours, computed from the file
    assert "| fedcache | homo | 20 | 4,000 | 4.40 |" in page
    assert "- fedavg hetero: averages model parameters" in page
    assert page.count(speed_docs.NOT_MEASURED) == 1  # the roofline: no file here
    assert speed_docs.render(page, tmp_path) == page  # rendering again changes nothing


def test_a_section_is_replaced_between_its_markers_or_appended_under_its_heading():
    begin, end = "<!-- x: begin -->", "<!-- x: end -->"
    appended = replace_section("intro\n", begin, end, f"{begin}\nold\n{end}", "## X")
    assert appended == f"intro\n\n## X\n\n{begin}\nold\n{end}\n"
    replaced = replace_section(appended + "outro\n", begin, end, f"{begin}\nnew\n{end}", "## X")
    assert replaced == f"intro\n\n## X\n\n{begin}\nnew\n{end}\noutro\n"
