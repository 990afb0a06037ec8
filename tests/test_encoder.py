"""Encoders: deterministic, normalised codes; MobileNet loads a state_dict file; bad weights fail clearly."""

import numpy as np
import pytest
import torch

from pipeline.config import EncodeParams
from pipeline.index.encoder import EncoderError, build_encoder, encode


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


@pytest.mark.slow  # builds MobileNetV3 twice and runs it: the end-to-end tier
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


# --- simhash: a seeded, data-independent binary code (HOG -> offset -> projection -> sign bits)

def _simhash(images, bits=256, seed=3, **kw):
    enc = build_encoder(EncodeParams(encoder="simhash", bits=bits, **kw), images.shape[1:], seed=seed)
    return encode(enc, images, batch_size=7)


@pytest.mark.parametrize("bits", [8, 64, 1024, 2048])
def test_simhash_packs_bits_over_8_bytes(bits, images):
    codes = _simhash(images, bits)
    assert codes.dtype == np.uint8 and codes.shape == (20, bits // 8)
    assert codes.nbytes == 20 * bits // 8
    unpacked = np.unpackbits(codes, axis=1)
    assert 0.2 < unpacked.mean() < 0.8  # both signs occur: not a constant code


def test_simhash_is_seeded_and_data_independent(images):
    a = _simhash(images)
    # same seed: the same code for an image whatever else is encoded with it, in any batch
    np.testing.assert_array_equal(_simhash(images[::-1])[::-1], a)
    np.testing.assert_array_equal(_simhash(images[5:6]), a[5:6])
    other = np.random.default_rng(9).integers(0, 256, (13, 28, 28), dtype=np.uint8)
    np.testing.assert_array_equal(_simhash(np.concatenate([other, images[3:4]]))[-1], a[3])
    # the projection itself depends on the seed and the shape only, never on images
    e1 = build_encoder(EncodeParams(encoder="simhash", bits=256), (28, 28), seed=3)
    e2 = build_encoder(EncodeParams(encoder="simhash", bits=256), (28, 28), seed=3)
    assert torch.equal(e1.proj, e2.proj)
    # another seed: another code
    assert (_simhash(images, seed=4) != a).mean() > 0.2


def test_simhash_bits_are_signs_of_the_projection(images):
    enc = build_encoder(EncodeParams(encoder="simhash", bits=64), images.shape[1:], seed=0)
    with torch.no_grad():
        from pipeline.index.encoder import _to_float
        proj = enc(_to_float(images)).numpy()
    np.testing.assert_array_equal(np.unpackbits(encode(enc, images, 8), axis=1), (proj > 0).astype(np.uint8))
    # the offset is fixed: centre / sqrt(d) on the unit-norm HOG features (d = 1296 at 28 px)
    assert enc.proj.shape == (1296, 64) and enc.offset == pytest.approx(0.5 / 1296**0.5)


def test_simhash_projection_is_orthogonal_in_blocks():
    enc = build_encoder(EncodeParams(encoder="simhash", bits=2048), (28, 28), seed=0)
    block = enc.proj[:, :1296]
    torch.testing.assert_close(block.T @ block, torch.eye(1296), atol=1e-4, rtol=0)


def test_simhash_similar_images_have_close_codes(images):
    # a slightly noisy copy is far closer in Hamming distance than an unrelated image
    rng = np.random.default_rng(1)
    noisy = np.clip(images.astype(int) + rng.integers(-3, 4, images.shape), 0, 255).astype(np.uint8)
    a, b = np.unpackbits(_simhash(images, 512), axis=1), np.unpackbits(_simhash(noisy, 512), axis=1)
    same = (a != b).sum(axis=1)
    other = (a != np.roll(b, 1, axis=0)).sum(axis=1)
    assert (same < other).all()


def test_bits_must_be_whole_bytes():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="multiple of 8"):
        EncodeParams(encoder="simhash", bits=100)
    with pytest.raises(ValidationError):
        EncodeParams(encoder="simhash", bits=0)
    with pytest.raises(ValidationError):
        EncodeParams(encoder="simhash", centre=-1.0)


def test_fedcache_setup_ledger_counts_packed_bytes(tmp_path, monkeypatch, mnist):
    """Round 0 of FedCache uploads, per client, n_k * (8 + 8 + bits/8) bytes: int64 ids,
    int64 labels, the packed code."""
    import duckdb

    from conftest import make_workspace
    from pipeline import paths
    from pipeline.methods.registry import REGISTRY
    from pipeline.train.engine import Trainer
    from pipeline.results.store import RunResultsDB

    bits = 64
    monkeypatch.chdir(tmp_path)
    _, params, part = make_workspace(tmp_path, mnist, {"encode": {"encoder": "simhash", "bits": bits},
                                                       "train": {"rounds": 1, "algorithms": ["fedcache"], "threads": 1}})
    codes = np.load(paths.HASHES)
    assert codes.dtype == np.uint8 and codes.shape == (part.num_train, bits // 8)
    trainer = Trainer(params, REGISTRY["fedcache"], part, mnist, paths.run_dir("fedcache"),
                      paths.checkpoint_path("fedcache"), RunResultsDB(paths.run_results("fedcache")), [paths.PARTITION])
    summary = trainer.run()
    con = duckdb.connect(str(paths.run_results("fedcache")), read_only=True)
    rows = con.execute("SELECT client_id, bytes FROM comm WHERE run_id = ? AND round = 0 AND kind = 'hashes' "
                       "ORDER BY client_id", [summary["run_id"]]).fetchall()
    con.close()
    sizes = np.diff(part.train_offsets)
    assert rows == [(k, int(n) * (8 + 8 + bits // 8)) for k, n in enumerate(sizes)]
    assert summary["bytes_setup"] == int(sizes.sum()) * (16 + bits // 8)
