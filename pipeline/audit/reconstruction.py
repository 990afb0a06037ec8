"""Reconstruction by code inversion: a curious FedCache server turns the codes it holds back into images.

Sources: Mahendran & Vedaldi, "Understanding Deep Image Representations by Inverting Them", CVPR 2015
(a representation leaks what can be recovered from it: invert it and look), and the learned inversion of
Dosovitskiy & Brox, "Inverting Visual Representations with Convolutional Networks", CVPR 2016 (train a
network on (code, image) pairs to map codes back to images, by mean squared error).

The attacker is the honest-but-curious FedCache server. At set-up it receives every private sample's
code (for the default `simhash` encoder, 1,024 sign bits of soft-binned HOG features, packed 8 to a
byte; other encoders send L2-normalised float codes: pipeline/index/encoder.py). The encoder is fixed
and seeded by params, so the server can run it too: it encodes PUBLIC images (samples no client holds
and no split uses) with the same encoder, trains an inverter on those (code, image) pairs, and applies
it to the private codes. The attack never sees a private image; the audit scores its output against
them with PSNR / SSIM (pipeline/audit/image_scores.py).

What a reconstruction must beat to count as a leak: `mean_image_baseline`, the attacker who ignores the
codes and answers every sample with the mean public image (the best constant answer under squared error).

Inverter: a multilayer perceptron, code -> 2 hidden layers (ReLU) -> every pixel (sigmoid, so in [0, 1]).
Not a transposed-convolution decoder, because a code has no spatial layout left to decode from: simhash
mixes all HOG cells in each projection, a float code is a normalised vector, and the pixels encoder's code
is the flattened image; a decoder would need a fully-connected layer from the code to a coarse grid first,
and at 14 x 14 or 28 x 28 grey pixels (196 / 784 outputs) a fully-connected output layer is cheap and
imposes no assumption on image size. Dosovitskiy & Brox invert fully-connected features the same way, by
fully-connected layers. Inputs are standardised with the public codes' per-feature mean and spread (the
attacker knows those); a tenth of the public pairs is held back to pick the epoch with the least
held-out error, so an inverter given codes that carry nothing falls back to about the mean image rather
than to a memorised public image.

Features with a spatial layout (FedDKC's and FedICT's per-sample stem feature maps, [channels, H, W] at the
image's own H x W: pipeline/audit/feature_inversion.py) keep it, so their inverter is convolutional instead
(`feature_shape`): two 3 x 3 convolutions, features -> CONV_CHANNELS maps (ReLU) -> the image's channels
(sigmoid), as He, Zhang & Lee's learned inverse network (ACSAC 2019) maps an early layer's output back to
pixels; the same training loop, standardisation and held-out epoch choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from pipeline.audit.image_scores import as_unit_images

BINARY_ENCODERS = ("simhash",)  # encoders whose codes are packed sign bits (uint8), not floats
# the convolutional inverter's hidden maps: a 3 x 3 stem (16 maps) needs few to undo, and a CPU trains them slowly
# (one random ResNet-8 stem, 28 x 28 digits, seed 0: 8 maps 23.9 dB, 16 maps 25.9 dB in 22 s on one thread, 32 maps
# 27.7 dB at about twice 16's cost)
CONV_CHANNELS = 16


def codes_as_features(codes: np.ndarray, encoder_name: str) -> np.ndarray:
    """Codes as stored / sent -> float32 features [N, D] an inverter reads.

    simhash: packed uint8 [N, bits/8] -> the sign bits as +1 / -1 [N, bits]. Other encoders: the float
    codes (float16 or float32, L2-normalised) as float32.
    """
    codes = np.asarray(codes)
    if codes.ndim != 2:
        raise ValueError(f"codes must be [N, D], got shape {codes.shape}")
    if encoder_name in BINARY_ENCODERS:
        if codes.dtype != np.uint8:
            raise TypeError(f"{encoder_name} codes are packed sign bits (uint8), got {codes.dtype}")
        bits = np.unpackbits(codes, axis=1)
        return bits.astype(np.float32) * 2.0 - 1.0
    if codes.dtype.kind != "f":
        raise TypeError(f"{encoder_name} codes are floats, got {codes.dtype}")
    return codes.astype(np.float32)


@dataclass
class Inverter:
    """A trained code -> image map and what it needs to read new codes like the ones it learned from."""

    net: nn.Module
    encoder_name: str
    feature_mean: torch.Tensor  # [D], of the public features
    feature_scale: torch.Tensor  # [D], their standard deviation (1 where a feature never varies)
    image_shape: tuple[int, ...]  # one image's shape, e.g. (14, 14)
    held_out_mse: float  # the chosen epoch's mean squared error on the held-back public pairs
    epochs_run: int  # which epoch was chosen (1-based)
    feature_shape: tuple[int, ...] | None = None  # [channels, H, W]: a convolutional inverter read them as maps


def _mlp(in_features: int, hidden: int, out_features: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                         nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out_features), nn.Sigmoid())


def _conv(feature_shape: tuple[int, ...], image_shape: tuple[int, ...]) -> nn.Sequential:
    """Feature maps [c, H, W] (flattened) -> an image [H, W] or [H, W, C] (flattened), by two 3 x 3 convolutions."""
    if len(feature_shape) != 3 or tuple(feature_shape[1:]) != tuple(image_shape[:2]):
        raise ValueError(f"a convolutional inverter needs feature maps [c, H, W] of the image's H x W; got "
                         f"{tuple(feature_shape)} for images {tuple(image_shape)}")
    colours = image_shape[2] if len(image_shape) == 3 else 1
    layers = [nn.Unflatten(1, tuple(feature_shape)), nn.Conv2d(feature_shape[0], CONV_CHANNELS, 3, padding=1),
              nn.ReLU(), nn.Conv2d(CONV_CHANNELS, colours, 3, padding=1), nn.Sigmoid()]
    if colours > 1:  # the targets are [H, W, C] flattened
        layers.append(_ChannelsLast())
    return nn.Sequential(*layers, nn.Flatten())


class _ChannelsLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1)


def _standardise(features: np.ndarray, stats: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    mean, scale = stats
    return (torch.from_numpy(features) - mean) / scale


def train_inverter(public_codes: np.ndarray, public_images: np.ndarray, epochs: int = 30, seed: int = 0, *,
                   encoder_name: str = "simhash", hidden: int = 512, lr: float = 1e-3, weight_decay: float = 1e-4,
                   batch_size: int = 64, held_out_fraction: float = 0.1, patience: int = 8,
                   feature_shape: tuple[int, ...] | None = None) -> Inverter:
    """Train an inverter on public (code, image) pairs by mean squared error on [0, 1] pixels.

    `public_codes`: the codes as the encoder stores them (`encode(...)` of pipeline/index/encoder.py run on
    the public images with the run's encoder); `public_images`: those images, uint8 [N, H, W] (or float in
    [0, 1]). Adam; the weights of the epoch with the least error on the held-back public pairs are kept, and
    training stops early after `patience` epochs without a better one. `feature_shape` ([c, H, W]): the codes
    are flattened feature maps of the image's H x W (encoder_name "features"), inverted by convolutions.
    Seeded: the same inputs and seed give the same inverter (on CPU).
    """
    features = codes_as_features(public_codes, encoder_name)
    images = as_unit_images(public_images).astype(np.float32)
    if len(features) != len(images):
        raise ValueError(f"{len(features)} codes but {len(images)} images")
    n_held = max(1, round(held_out_fraction * len(images)))
    if len(images) - n_held < batch_size:
        raise ValueError(f"{len(images)} public pairs are too few to train an inverter (need > {batch_size + n_held})")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(images), generator=gen).numpy()
    held, train = order[:n_held], order[n_held:]

    mean = torch.from_numpy(features[train].mean(axis=0))
    scale = torch.from_numpy(features[train].std(axis=0))
    scale = torch.where(scale > 1e-6, scale, torch.ones_like(scale))
    x_train, x_held = _standardise(features[train], (mean, scale)), _standardise(features[held], (mean, scale))
    y_train = torch.from_numpy(images[train].reshape(len(train), -1))
    y_held = torch.from_numpy(images[held].reshape(n_held, -1))

    torch.manual_seed(seed)  # the initial weights
    net = (_mlp(x_train.shape[1], hidden, y_train.shape[1]) if feature_shape is None
           else _conv(feature_shape, images.shape[1:]))
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    best_mse, best_epoch, best_state = float("inf"), 0, None
    for epoch in range(1, epochs + 1):
        net.train()
        for batch in torch.randperm(len(train), generator=gen).split(batch_size):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(net(x_train[batch]), y_train[batch])
            loss.backward()
            optimizer.step()
        net.eval()
        with torch.no_grad():
            held_mse = nn.functional.mse_loss(net(x_held), y_held).item()
        if held_mse < best_mse:
            best_mse, best_epoch = held_mse, epoch
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
        elif epoch - best_epoch >= patience:
            break
    net.load_state_dict(best_state)
    net.eval()
    return Inverter(net, encoder_name, mean, scale, tuple(images.shape[1:]), best_mse, best_epoch,
                    tuple(feature_shape) if feature_shape is not None else None)


@torch.no_grad()
def invert(inverter: Inverter, codes: np.ndarray) -> np.ndarray:
    """The inverter's images for `codes` (as stored / sent, same encoder): float32 [N, H, W] in [0, 1]."""
    features = codes_as_features(codes, inverter.encoder_name)
    if features.shape[1] != inverter.feature_mean.shape[0]:
        raise ValueError(f"codes give {features.shape[1]} features; the inverter was trained on "
                         f"{inverter.feature_mean.shape[0]}")
    x = _standardise(features, (inverter.feature_mean, inverter.feature_scale))
    return inverter.net(x).numpy().reshape(len(features), *inverter.image_shape)


def mean_image_baseline(public_images: np.ndarray, n: int) -> np.ndarray:
    """The attacker who ignores the codes: the mean public image, n times: float32 [n, H, W] in [0, 1]."""
    mean = as_unit_images(public_images).mean(axis=0).astype(np.float32)
    return np.repeat(mean[None], n, axis=0)
