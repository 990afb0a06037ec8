"""The paper's figures file loads, names presets that exist, and those presets run what the rows say."""

import pytest

from conftest import REPO_ROOT
from pipeline.experiments import presets
from pipeline.results import paper
from pipeline.methods.registry import REGISTRY
from pipeline.errors import InputFileError


def test_every_row_loads_and_names_a_preset_that_runs_its_setting():
    rows = paper.load()
    assert {(r.table, r.dataset) for r in rows} == {(5, "mnist"), (5, "fashion_mnist"), (6, "mnist"),
                                                    (6, "fashion_mnist")}
    fm5 = paper.lookup(rows, "fashion_mnist", "fedcache", "homo")
    assert (fm5.maua, fm5.comm_gb, fm5.speedup, fm5.reference) == (pytest.approx(0.7771), 0.08, 258.9, "pfedme")
    for r in rows:
        flat = presets.check(r.preset, REPO_ROOT / "params.yaml", REPO_ROOT / "presets")  # exists and is valid
        assert flat["partition.num_clients"] == 300 and flat["data.dataset"] == r.dataset, r
        runs = flat["train.algorithms"] if r.setting == "homo" else flat["train.hetero_algorithms"]
        assert r.method in REGISTRY and r.method in runs, f"{r.preset} does not run {r.method} ({r.setting})"
        assert flat["train.model"] == "resnet20"  # A3 (homogeneous); hetero runs use A1/A2/A3 by index


@pytest.mark.parametrize("text, says", [
    ("table,dataset\n5,mnist\n", r"missing column\(s\) setting"),
    (",".join(paper.COLUMNS) + "\n5,mnist,homo,fd,A3,,about 84,,,pfedme,table5_mnist\n", "line 2: maua_pct"),
    (",".join(paper.COLUMNS) + "\n5,mnist,both,fd,A3,,84,,,pfedme,table5_mnist\n", "line 2: setting"),
])
def test_a_bad_figures_file_names_file_line_and_column(tmp_path, text, says):
    path = tmp_path / "figures.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=says):
        paper.load(path)


def test_the_report_puts_the_papers_figures_beside_the_measured_rows(tmp_path):
    from pipeline.results.report import format_paper_table, write_outputs

    row = {"algorithm": "fedcache", "label": "fedcache (T=1.0)", "setting": "homo", "rounds": 10, "maua": 0.7334,
           "final_acc": 0.73,
           "bytes_total": 26_208_000, "bytes_setup": 15_648_000, "bytes_training": 10_560_000, "target_acc": 0.75,
           "bytes_to_target": None, "bytes_to_target_no_setup": None, "speedup": 146.7, "speedup_no_setup": 186.7,
           "speedup_target": 0.5838, "speedup_vs": "pfedme", "bytes_to_level": 26_208_000,
           "bytes_to_level_no_setup": 10_560_000, "run_id": "fedcache-1"}
    other = {**row, "algorithm": "local", "label": "local", "run_id": "local-1"}  # the paper has no local-only row
    text = format_paper_table([row, other], "fashion_mnist")
    # the paper's row is found by the algorithm; the run is named by its label (what ran)
    assert ("| fedcache (T=1.0) | homo | 73.34% | 77.71% (Table 5) | -4.4 | 0.0262 (to 58.38%) | 0.0106 (to 58.38%) | "
            "0.08 | 146.7x vs pfedme at 58.38% | 186.7x vs pfedme at 58.38% | 258.9x vs pfedme |") in text
    assert "paper GB to its target (w/o set-up) | speed-up (with set-up) | speed-up w/o set-up |" in text
    assert "| local |" not in text
    assert format_paper_table([row], "cifar10") == ""
    write_outputs([row, other], tmp_path / "metrics.json", tmp_path / "report", "fashion_mnist")
    assert "77.71% (Table 5)" in (tmp_path / "report/comparison.md").read_text()
