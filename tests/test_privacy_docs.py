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


def _workspace(root, sigma: float, clip, epsilon, maua: float, auc: float):
    """A workspace as `dvc repro` leaves it, FedCache only: params.yaml, its audit, metrics.json, its summary."""
    import yaml

    (root / "results/audit/fedcache").mkdir(parents=True)
    (root / "results/runs/fedcache").mkdir(parents=True)
    (root / "params.yaml").write_text(yaml.safe_dump({"train": {"dp_noise": sigma, "dp_clip": clip}}))
    audit = {"method": "fedcache", "reconstruction": {"applies": True, **{k: ROW[k] for k in ("psnr", "ssim")},
                                                      "baseline_psnr": ROW["baseline_psnr"]},
             "membership": {"loss": {"auc": auc, "auc_low": auc - 0.02, "auc_high": auc + 0.02}},
             "label_mix": {"tv": 0.0, "tv_low": 0.0, "tv_high": 0.0, "hows": ["sent by design"]}}
    (root / "results/audit/fedcache/audit.json").write_text(json.dumps(audit))
    (root / "results/metrics.json").write_text(json.dumps({"fedcache": {"maua": maua, "maua_low": maua - 0.03,
                                                                        "maua_high": maua + 0.03}}))
    summary = {"maua": maua} if epsilon is None else {"maua": maua, "dp_noise": sigma, "dp_clip": clip,
                                                       "dp_delta": 1e-5, "dp_releases": 91, "dp_epsilon": epsilon}
    (root / "results/runs/fedcache/summary.json").write_text(json.dumps(summary))
    return root


def test_the_noise_curve_comes_from_the_noised_workspaces(tmp_path):
    off = _workspace(tmp_path / "off", 0.0, None, None, 0.66, 0.61)
    one = _workspace(tmp_path / "one", 1.0, 20.0, 123.4, 0.52, 0.58)
    curve = privacy_docs.noise_curve(off, {1.0: one})
    assert [c["sigma"] for c in curve] == [0.0, 1.0] and curve[0]["dp"] is None and curve[1]["dp"]["dp_epsilon"] == 123.4
    (tmp_path / "privacy-made-up.json").write_text(json.dumps({**RESULT, "noise_curve": curve}))
    page = privacy_docs.render("# Privacy\n", tmp_path)
    assert "| 0 | n/a | off | 0.660 [0.630, 0.690] | n/a | 15.5 [14.9, 16.1] | 0.61 [0.59, 0.63] |" in page
    assert ("| 1 | 20 | 123.4 (delta 1e-05, sigma 1) | 0.520 [0.490, 0.550] | n/a | 15.5 [14.9, 16.1] | "
            "0.58 [0.56, 0.60] |") in page  # no results files here: no paired difference
    assert privacy_docs.render(page, tmp_path) == page
    curve[1]["vs_off"] = {"mean": -0.14, "low": -0.2, "high": -0.08, "verdict": "behind"}
    (tmp_path / "privacy-made-up.json").write_text(json.dumps({**RESULT, "noise_curve": curve}))
    assert "| 0.520 [0.490, 0.550] | -0.140 [-0.200, -0.080] behind |" in privacy_docs.render("# Privacy\n", tmp_path)
