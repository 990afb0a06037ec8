"""Single views called directly (Streamlit in bare mode: its calls draw nothing and return)."""

from __future__ import annotations

import pytest

from dashboard import stages, views
from dashboard.config import Config
from pipeline.data.partition import make_partition, partition_stats, write_stats


@pytest.fixture
def drawn_mixes(monkeypatch):
    """The label mixes the partition view hands to its heatmap."""
    mixes = []
    real = views.charts.label_heatmap

    def record(mix):
        mixes.append(mix)
        return real(mix)

    monkeypatch.setattr(views.charts, "label_heatmap", record)
    return mixes


def _config(tmp_path) -> Config:
    return Config(results_db=tmp_path / "results.duckdb", partition_dir=tmp_path / "partition", cache_db=None,
                  data_root=None, refresh_s=0)


def test_partition_view_reads_the_stats_it_was_not_given(tmp_path, synthetic_labels, default_params_raw,
                                                         drawn_mixes):
    # The app passes stats=None when the file was missing as it started; if it exists by the time the
    # view draws, the view reads it and draws it (it used to drop what it read and fail on None).
    from pipeline.config import parse_params

    cfg = _config(tmp_path)
    default_params_raw["partition"].update(num_clients=4, samples_per_client=50)
    p = parse_params(default_params_raw).partition
    train_y, test_y = synthetic_labels
    write_stats(partition_stats(make_partition(train_y, test_y, 10, p, 0)), cfg.stats_path)
    views.view_partition(cfg, None, {"data": {"dataset": "mnist"}})
    assert len(drawn_mixes) == 1
    mix = drawn_mixes[0]
    assert len(mix) == 4 * 10 and mix["count"].sum() == 200


def test_partition_view_without_stats_says_what_to_run(tmp_path, drawn_mixes):
    with pytest.raises(stages.InputMissing, match="dvc repro partition"):
        views.view_partition(_config(tmp_path), None, {})
    assert drawn_mixes == []
