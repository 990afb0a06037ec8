"""The reconstruction attacks added for MTFL, pFedMe, FedAlt (gradient inversion of part of a model, pFedMe's reading
of its update) and FedDKC, FedICT (feature inversion): each scores high when a leak is planted and does not when it is
removed, so a broken attack cannot pass.

Bounds were set from seeds 0-4 run by hand (14 x 14 digits, 1,000 public / 200 private images, 30 epochs; the tests
run seed 0):
  feature inversion, identity extractor (the features are the image): PSNR 19.7-20.8 dB, SSIM 0.93-0.95;
      mean image 11.7-11.9 dB, SSIM 0.31-0.33
  feature inversion, random features (no leak): PSNR 10.0-10.2 dB (1.7-1.8 below the mean image: noise maps pass
      through the convolutions), SSIM -0.007 to -0.005
  DLG matching only the gradients past a private first layer, one digit: PSNR 51.6-100 dB (capped); zero gradients
      4.5-4.7 dB
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from pipeline.audit.feature_inversion import invert_features
from pipeline.audit.gradient_inversion import dlg, model_gradient, pfedme_delta_as_gradient
from pipeline.audit.image_scores import psnr_ssim
from pipeline.audit.reconstruction import mean_image_baseline, train_inverter
from pipeline.federation.clients import to_tensor
from test_audit_reconstruction import sigmoid_lenet

N_PUBLIC, N_PRIVATE = 1000, 200


def split(images: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(public images, private images): disjoint, seeded."""
    order = np.random.default_rng(seed).permutation(len(images))
    return images[order[:N_PUBLIC]], images[order[N_PUBLIC:N_PUBLIC + N_PRIVATE]]


# --- feature inversion ---------------------------------------------------------------------------------

def identity_extractor(images: np.ndarray) -> np.ndarray:
    """Planted leak: the features are the image itself (as the model reads it: one [-1, 1] map)."""
    return to_tensor(images).numpy()


def random_extractor(seed: int):
    """Leak removed: 4 maps of noise a sample, drawn independently of the image."""
    rng = np.random.default_rng(seed)
    return lambda images: rng.standard_normal((len(images), 4, *images.shape[1:])).astype(np.float32)


def feature_inversion_scores(images: np.ndarray, extract, seed: int) -> tuple[list[float], list[float]]:
    """([PSNR, SSIM] of the inverted private features, [PSNR, SSIM] of the mean public image), means."""
    public, private = split(images, seed)
    recovered, _ = invert_features(extract, public, extract(private), epochs=30, seed=seed)
    attack = psnr_ssim(private, recovered)
    baseline = psnr_ssim(private, mean_image_baseline(public, len(private)))
    return [float(s.mean()) for s in attack], [float(s.mean()) for s in baseline]


@pytest.mark.slow  # a learning check: trains an inverter
def test_features_that_are_the_image_are_inverted(small_mnist):
    (psnr, ssim), (base_psnr, base_ssim) = feature_inversion_scores(small_mnist.train_x, identity_extractor, 0)
    assert psnr > 18.0 and psnr > base_psnr + 6.0, (psnr, base_psnr)
    assert ssim > 0.85 and ssim > base_ssim + 0.4, (ssim, base_ssim)


@pytest.mark.slow  # a learning check: trains an inverter
def test_random_features_do_no_better_than_the_mean_image(small_mnist):
    (psnr, ssim), (base_psnr, base_ssim) = feature_inversion_scores(small_mnist.train_x, random_extractor(0), 0)
    assert psnr < base_psnr + 0.5 and ssim < base_ssim + 0.03, (psnr, base_psnr, ssim, base_ssim)


def test_a_convolutional_inverter_needs_maps_of_the_images_size():
    images = np.zeros((200, 14, 14), np.uint8)
    with pytest.raises(ValueError, match="feature maps"):
        train_inverter(np.zeros((200, 4 * 7 * 7), np.float32), images, epochs=1, encoder_name="features",
                       feature_shape=(4, 7, 7))


# --- DLG on part of a model ------------------------------------------------------------------------------

# DLG's test model (tests/test_audit_reconstruction.py); its first convolution plays a layer the client keeps
# (MTFL's BatchNorm): the server does not hold its gradient
SHARED = {"2.weight", "2.bias", "5.weight", "5.bias"}  # every tensor but the private first convolution


def partial_dlg_psnr(images: np.ndarray, labels: np.ndarray, seed: int, planted: bool) -> float:
    model = sigmoid_lenet(seed)
    image, label = images[seed:seed + 1], labels[seed:seed + 1]
    grads = model_gradient(model, to_tensor(image), torch.as_tensor(label), match=SHARED)
    if not planted:  # leak removed: the server is handed no information
        grads = [torch.zeros_like(g) for g in grads]
    names = [n for n, _ in model.named_parameters() if n in SHARED]
    result = dlg(model, dict(zip(names, grads)), None, (1, 1, 14, 14), steps=20, seed=seed, match=SHARED)
    return float(psnr_ssim(image, result.images)[0][0])


@pytest.mark.slow  # runs DLG to convergence
@pytest.mark.parametrize("planted", [True, False], ids=["gradient", "zeros"])
def test_dlg_recovers_a_digit_from_the_gradients_of_the_shared_layers_alone(small_mnist, planted):
    psnr = partial_dlg_psnr(small_mnist.train_x, small_mnist.train_y, 0, planted)
    assert (psnr > 30.0) if planted else (psnr < 10.0), psnr


def test_dlg_refuses_a_tensor_the_model_lacks():
    with pytest.raises(KeyError, match="unknown"):
        dlg(sigmoid_lenet(0), {}, None, (1, 1, 14, 14), steps=1, match={"nope"})


# --- pFedMe's update read as a gradient ----------------------------------------------------------------

@pytest.mark.parametrize("K, batches", [(1, 1), (3, 4)])
def test_pfedmes_change_of_w_reads_back_as_its_constant_gradient(K, batches):
    """pFedMe's client rule run literally (pipeline/methods/pfedme/method.py: K prox steps on theta with weight
    decay mu, then w toward theta, per batch) on a linear loss, whose gradient is the same at every step: the
    reading must give that gradient back. Reading it as plain SGD (delta_as_gradient) does not."""
    from pipeline.audit.gradient_inversion import delta_as_gradient

    lr, lam, mu, eta = 0.01, 15.0, 0.001, 0.005
    torch.manual_seed(0)
    theta = nn.Linear(4, 3)
    direction = torch.randn(3, 4)
    start = {n: p.detach().clone() for n, p in theta.named_parameters()}
    w = {n: t.clone() for n, t in start.items()}
    opt = torch.optim.SGD(theta.parameters(), lr=lr, weight_decay=mu)
    for _ in range(batches):
        for _ in range(K):
            opt.zero_grad()
            prox = sum(((p - w[n]) ** 2).sum() for n, p in theta.named_parameters())
            ((theta.weight * direction).sum() + theta.bias.sum() + lam / 2 * prox).backward()
            opt.step()
        with torch.no_grad():
            for n, p in theta.named_parameters():
                w[n] -= eta * lam * (w[n] - p)
    delta = {n: w[n] - start[n] for n in w}
    grads = pfedme_delta_as_gradient(delta, start, personal_lr=lr, lambda_=lam, mu=mu, eta=eta, K=K, batches=batches)
    torch.testing.assert_close(grads["weight"], direction, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(grads["bias"], torch.ones(3), rtol=1e-3, atol=1e-4)
    plain = delta_as_gradient(delta, lr, K * batches)
    assert not torch.allclose(plain["weight"], direction, rtol=0.1)
