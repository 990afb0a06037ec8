"""docs/privacy.md's measured section is what the audits' result files render (bench/privacy_docs.py): no figure
typed by hand."""

from __future__ import annotations

import json

from bench import privacy_docs

ROW = {"run": "fedcache", "method": "fedcache", "psnr": {"mean": 15.5, "low": 14.9, "high": 16.1},
       "ssim": {"mean": 0.61, "low": 0.58, "high": 0.64}, "baseline_psnr": {"mean": 10.9, "low": 10.7, "high": 11.1},
       "mia_auc": {"mean": 0.61, "low": 0.55, "high": 0.66}, "mia_tpr": {"mean": 0.05, "low": 0.02, "high": 0.09},
       "lira_auc": {"mean": 0.59, "low": 0.54, "high": 0.63}, "label_tv": {"mean": 0.0, "low": 0.0, "high": 0.0},
       "uniform_tv": {"mean": 0.41, "low": 0.37, "high": 0.45}, "label_how": "sent by design", "maua": 0.7123,
       "maua_low": 0.69, "maua_high": 0.73, "bytes_total": 1234567, "seconds": 20.5, "summary": "...",
       "kept_bytes": 2_650_000}
RESULT = {"cpu": "Made-up CPU, 2 CPUs", "date": "2026-01-01", "setting": "the default", "command": "`dvc repro`",
          "rows": [ROW], "audit_seconds": 20.5,
          "bits_curve": [{"bits": 1024, "maua": 0.71, "maua_low": 0.69, "maua_high": 0.73, "bytes_setup": 256000,
                          "psnr": ROW["psnr"], "ssim": ROW["ssim"], "baseline_psnr": ROW["baseline_psnr"]}]}


def test_the_page_is_what_the_result_files_render():
    assert privacy_docs.main(["--check"]) == 0, "run .venv/bin/python bench/privacy_docs.py"


def test_figures_come_from_the_files(tmp_path):
    (tmp_path / "privacy-made-up.json").write_text(json.dumps(RESULT))
    page = privacy_docs.render("# Privacy\n", tmp_path)
    assert "| fedcache | 15.5 [14.9, 16.1] (10.9) |" in page and "| fedcache | 0.712 [0.690, 0.730] | 1,234,567 | 20.5 | 2.6 |" in page
    assert "took 20.5 s in all" in page and "| 1024 | 0.710 [0.690, 0.730] | 256,000 | 15.5 [14.9, 16.1] |" in page
    assert privacy_docs.render(page, tmp_path) == page  # rendering again changes nothing
    assert privacy_docs.NOT_MEASURED in privacy_docs.render("# Privacy\n", tmp_path / "none")
