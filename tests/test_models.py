"""Client models: the paper's parameter counts, penultimate features, hetero assignment."""

import pytest
import torch

from models.resnet import HETERO_CYCLE, build_model, count_parameters


@pytest.mark.parametrize("name, paper_k", [("resnet8", 76.2), ("resnet16", 171.2), ("resnet20", 266.1)])
def test_parameter_counts_match_the_paper(name, paper_k):
    # the paper's A1/A2/A3 sizes are counts for 3-channel input divided by 1024
    assert round(count_parameters(build_model(name, 3, 10)) / 1024, 1) == paper_k


@pytest.mark.parametrize("channels, size", [(1, 28), (3, 32)])
def test_features_and_logits(channels, size):
    model = build_model("resnet8", channels, 10).eval()
    x = torch.randn(5, channels, size, size)
    feats = model.features(x)
    assert feats.shape == (5, model.feature_dim)
    torch.testing.assert_close(model.head(feats), model(x))


def test_hetero_cycle_is_a1_a2_a3():
    from pipeline.config import parse_params
    from pipeline.clients import model_name

    params = parse_params({"train": {"model": "resnet16"}})
    assert [model_name(params, i, hetero=True) for i in range(6)] == ["resnet8", "resnet16", "resnet20"] * 2
    assert HETERO_CYCLE == ("resnet8", "resnet16", "resnet20")
    assert {model_name(params, i, hetero=False) for i in range(6)} == {"resnet16"}


def test_unknown_model_is_an_error():
    with pytest.raises(ValueError, match="resnet8"):
        build_model("resnet50", 3, 10)
