"""Encoders: deterministic, normalised codes; MobileNet loads a state_dict file; bad weights fail clearly."""

import numpy as np
import pytest
import torch

from pipeline.config import EncodeParams
from pipeline.encoder import EncoderError, build_encoder, encode


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (20, 28, 28), dtype=np.uint8)


@pytest.mark.parametrize("name", ["hog", "random_conv", "random_projection", "pixels"])
def test_codes_are_unit_norm_and_deterministic(name, images):
    p = EncodeParams(encoder=name, dim=64)
    a = encode(build_encoder(p, images.shape[1:], seed=3), images, batch_size=7, dtype="float32")
    b = encode(build_encoder(p, images.shape[1:], seed=3), images, batch_size=20, dtype="float32")
    assert a.shape[0] == 20 and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-5)  # same seed, any batch size: same codes


def test_each_sample_is_encoded_independently(images):
    # a client's codes must not depend on which other samples share its batch
    enc = build_encoder(EncodeParams(encoder="hog"), images.shape[1:], seed=0)
    whole = encode(enc, images, batch_size=20, dtype="float32")
    alone = encode(enc, images[5:6], batch_size=1, dtype="float32")
    np.testing.assert_allclose(whole[5], alone[0], atol=1e-5)


def test_hog_handles_colour(images):
    colour = np.repeat(images[..., None], 3, axis=-1)
    enc = build_encoder(EncodeParams(encoder="hog"), colour.shape[1:], seed=0)
    grey = build_encoder(EncodeParams(encoder="hog"), images.shape[1:], seed=0)
    np.testing.assert_allclose(encode(enc, colour, 8, "float32"), encode(grey, images, 8, "float32"), atol=1e-3)


def test_float16_storage(images):
    codes = encode(build_encoder(EncodeParams(encoder="hog"), images.shape[1:], 0), images, 8, "float16")
    assert codes.dtype == np.float16 and np.isfinite(codes).all()


def test_mobilenet_loads_state_dict_file(tmp_path, images):
    from torchvision.models import mobilenet_v3_small

    torch.manual_seed(1)
    net = mobilenet_v3_small(weights=None)
    path = tmp_path / "mnv3.pt"
    torch.save(net.state_dict(), path)
    p = EncodeParams(encoder="mobilenet_v3_small", weights=str(path), image_size=32)
    enc = build_encoder(p, images.shape[1:], seed=0)
    assert torch.equal(enc.features[0][0].weight, net.features[0][0].weight)
    codes = encode(enc, images[:4], 4, "float32")
    assert codes.shape == (4, 576)


def test_mobilenet_bad_weights_are_clear_errors(tmp_path, images):
    with pytest.raises(EncoderError, match="no such file"):
        build_encoder(EncodeParams(encoder="mobilenet_v3_small", weights=str(tmp_path / "nope.pt")), (28, 28), 0)
    wrong = tmp_path / "wrong.pt"
    torch.save({"foo": torch.zeros(2)}, wrong)
    with pytest.raises(EncoderError, match="not a MobileNetV3-small state_dict"):
        build_encoder(EncodeParams(encoder="mobilenet_v3_small", weights=str(wrong)), (28, 28), 0)
