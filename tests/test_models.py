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
    from pipeline.federation.clients import model_name

    params = parse_params({"train": {"model": "resnet16"}})
    assert [model_name(params, i, hetero=True) for i in range(6)] == ["resnet8", "resnet16", "resnet20"] * 2
    assert HETERO_CYCLE == ("resnet8", "resnet16", "resnet20")
    assert {model_name(params, i, hetero=False) for i in range(6)} == {"resnet16"}


def test_unknown_model_is_an_error():
    with pytest.raises(ValueError, match="resnet8"):
        build_model("resnet50", 3, 10)


def test_server_model_a4s_is_resnet56_without_stem():
    """A4^S reads the clients' 16-channel stem features. The paper gives 588.2 K parameters; FedGKT's
    stem-less bottleneck ResNet-56, the server model of the code FedDKC and FedICT build on, has
    590,858 (577.0 Ki): the closest of the ResNet-56 variants (README "FedDKC and FedICT")."""
    from models.server import build_server_model

    server = build_server_model(10)
    assert count_parameters(server) == 590_858
    assert abs(count_parameters(server) / 1000 - 588.2) / 588.2 < 0.005
    client = build_model("resnet8", 1, 10)
    feats = client.stem(torch.randn(2, 1, 28, 28))
    assert feats.shape == (2, 16, 28, 28) and server(feats).shape == (2, 10)
    assert not any(isinstance(m, torch.nn.Conv2d) and m.in_channels == 1 for m in server.modules())


def test_server_model_a3_is_resnet20_without_stem():
    from models.server import build_server_model

    server = build_server_model(10, "a3")
    stem = count_parameters(build_model("resnet20", 3, 10).stem)
    assert count_parameters(server) == count_parameters(build_model("resnet20", 3, 10)) - stem
    assert server(torch.randn(2, 16, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="a4s, a3"):
        build_server_model(10, "resnet56")
