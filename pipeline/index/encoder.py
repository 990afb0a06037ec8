"""Fixed encoders that turn a client's own images into hash codes (FedCache eq. 14).

Every client runs the same fixed encoder on its own samples only; the encoder never sees
another client's data and is never trained, which is the paper's privacy argument. The
server only ever sees the codes.

Options (params `encode.encoder`):
  hog                data-independent: histograms of oriented gradients (float codes)
  simhash            data-independent binary code: HOG (soft orientation bins), minus a fixed
                     offset, times a seeded orthogonalised Gaussian matrix, sign bits packed
                     8 to a byte (`encode.bits` bits = bits/8 bytes per sample; compared by
                     Hamming distance). See the README's hash-quality table.
  random_conv        data-independent: a conv net with seeded random weights
  random_projection  data-independent: centred pixels times a seeded Gaussian matrix
  pixels             the centred pixels themselves (a reference, not private)
  mobilenet_v3_small torchvision's MobileNetV3-small without its classifier (the paper's
                     choice). `encode.weights`: "imagenet" (torchvision's cache, downloaded
                     by torchvision when online), a path to a state_dict file, or null for
                     random initialisation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import EncodeParams
from pipeline.errors import UserError
from pipeline.seeds import torch_generator

MOBILENET_DIM = 576  # width of MobileNetV3-small's pooled features


class EncoderError(UserError, RuntimeError):
    pass


def _to_float(images: np.ndarray) -> torch.Tensor:
    """uint8 [B,H,W] or [B,H,W,3] -> float [B,C,H,W] in [-0.5, 0.5] (fixed centring, no data statistics)."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0).sub_(0.5)
    return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)


class RandomConvEncoder(nn.Module):
    """Three random 3x3 conv layers (ReLU, pooling) then a random projection to `dim`.

    Random conv features keep local structure (edges, blobs) that raw-pixel cosine misses,
    yet nothing is learned from any data.
    """

    def __init__(self, in_channels: int, dim: int, image_size: int, generator: torch.Generator):
        super().__init__()
        self.image_size = image_size
        widths = [in_channels, 32, 64, 128]
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1, bias=False) for a, b in zip(widths, widths[1:]))
        for conv in self.convs:
            fan_in = conv.in_channels * 9
            conv.weight.data = torch.randn(conv.weight.shape, generator=generator) * (2.0 / fan_in) ** 0.5
        feat = widths[-1] * 4 * 4
        self.register_buffer("proj", torch.randn(feat, dim, generator=generator) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        for conv in self.convs:
            x = F.max_pool2d(F.relu(conv(x)), 2)
        x = F.adaptive_avg_pool2d(x, 4).flatten(1)
        return x @ self.proj


class HogEncoder(nn.Module):
    """Histograms of oriented gradients: 9 unsigned orientation bins per 4x4-pixel cell,
    L2-normalised over 2x2-cell blocks, square-rooted (Hellinger-style, which damps strong
    edges). Fixed arithmetic, nothing learned. Colour images are turned to grey first.

    `soft`: each pixel's gradient magnitude is split linearly between the two orientation
    bins nearest its angle (circularly) instead of going whole into one; an angle near a
    bin edge then no longer flips the histogram. The simhash encoder uses it.
    """

    def __init__(self, cell: int = 4, bins: int = 9, soft: bool = False):
        super().__init__()
        self.cell, self.bins, self.soft = cell, bins, soft
        self.register_buffer("dx", torch.tensor([[[[-1.0, 0.0, 1.0]]]]))
        self.register_buffer("dy", torch.tensor([[[[-1.0], [0.0], [1.0]]]]))
        self.register_buffer("grey", torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 3:
            x = (x * self.grey).sum(dim=1, keepdim=True)
        gx = F.conv2d(x, self.dx, padding=(0, 1))
        gy = F.conv2d(x, self.dy, padding=(1, 0))
        magnitude = torch.sqrt(gx**2 + gy**2)
        angle = torch.remainder(torch.atan2(gy, gx), torch.pi)  # unsigned orientation in [0, pi)
        hist = torch.zeros(x.shape[0], self.bins, *x.shape[2:], device=x.device)
        if self.soft:
            pos = angle * (self.bins / torch.pi) - 0.5  # in bin units, 0 = centre of bin 0
            low = torch.floor(pos)
            frac = pos - low
            low = low.long().remainder_(self.bins)
            hist.scatter_add_(1, low, magnitude * (1 - frac))
            hist.scatter_add_(1, (low + 1).remainder_(self.bins), magnitude * frac)
        else:
            which = (angle * (self.bins / torch.pi)).long().clamp_(max=self.bins - 1)
            hist.scatter_(1, which, magnitude)
        cells = F.avg_pool2d(hist, self.cell)  # [B, bins, H/cell, W/cell]
        blocks = cells.unfold(2, 2, 1).unfold(3, 2, 1).permute(0, 2, 3, 1, 4, 5).flatten(3)
        return F.normalize(blocks, dim=3).flatten(1).sqrt()


class SimHashEncoder(nn.Module):
    """HOG (soft orientation bins) -> unit norm -> minus a fixed offset -> seeded projection.

    The module returns the `bits` projections; `encode` keeps their signs, packed 8 to a byte.
    Everything is fixed by the seed and the image shape (no data statistics): the offset is
    `centre / sqrt(d)` on every one of the d HOG features (a flat unit vector has entries
    1/sqrt(d)); HOG features are all non-negative, so without it every code lies in one
    narrow cone and most random hyperplanes split none of it. The Gaussian matrix is
    orthogonalised in blocks of d columns (QR), so the first min(bits, d) hyperplanes are
    mutually orthogonal, which makes Hamming distance a less noisy estimate of the angle.
    """

    binary = True

    def __init__(self, image_shape: tuple[int, ...], bits: int, centre: float, generator: torch.Generator):
        super().__init__()
        self.hog = HogEncoder(soft=True)
        channels = 1 if len(image_shape) == 2 else image_shape[-1]
        d = self.hog(torch.zeros(1, channels, *image_shape[:2])).shape[1]
        gauss = torch.randn(d, bits, generator=generator, dtype=torch.float64)
        blocks = [torch.linalg.qr(gauss[:, s : s + d]).Q for s in range(0, bits, d)]
        self.register_buffer("proj", torch.cat(blocks, dim=1).float())
        self.offset = centre / d**0.5
        self.bits = bits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.normalize(self.hog(x), dim=1) - self.offset) @ self.proj


class RandomProjectionEncoder(nn.Module):
    def __init__(self, in_features: int, dim: int, generator: torch.Generator):
        super().__init__()
        self.register_buffer("proj", torch.randn(in_features, dim, generator=generator) / dim**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.proj


class PixelEncoder(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


class MobileNetEncoder(nn.Module):
    """MobileNetV3-small features + global pooling; the classifier is dropped."""

    def __init__(self, weights: str | None, image_size: int):
        super().__init__()
        from torchvision.models import MobileNet_V3_Small_Weights, mobilenet_v3_small

        self.image_size = image_size
        if weights == "imagenet":
            try:
                net = mobilenet_v3_small(weights=MobileNet_V3_Small_Weights.IMAGENET1K_V1)
            except Exception as err:  # offline and not in torchvision's cache
                raise EncoderError(
                    "encode.weights = 'imagenet': torchvision could not load the ImageNet weights "
                    f"({type(err).__name__}: {err}). When online, torchvision downloads them into "
                    f"{torch.hub.get_dir()}/checkpoints; offline, copy mobilenet_v3_small-047dcff4.pth "
                    "there or set encode.weights to the path of a state_dict file"
                ) from None
        else:
            net = mobilenet_v3_small(weights=None)
            if weights is not None:
                path = Path(weights)
                if not path.is_file():
                    raise EncoderError(f"encode.weights = {weights!r}: no such file (expected a MobileNetV3-small state_dict)")
                state = torch.load(path, map_location="cpu", weights_only=True)
                try:
                    net.load_state_dict(state)
                except RuntimeError as err:
                    raise EncoderError(f"encode.weights = {weights!r} is not a MobileNetV3-small state_dict: {err}") from None
        self.features = net.features
        self.pool = net.avgpool
        # ImageNet normalisation, applied to our [-0.5, 0.5] inputs
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) - 0.5)
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        x = (x - self.mean) / self.std
        return self.pool(self.features(x)).flatten(1)


def build_encoder(p: EncodeParams, image_shape: tuple[int, ...], seed: int) -> nn.Module:
    """The fixed encoder every client shares (same seed, same weights)."""
    channels = 1 if len(image_shape) == 2 else image_shape[-1]
    gen = torch_generator(seed, "encoder")
    if p.encoder == "hog":
        enc: nn.Module = HogEncoder()
    elif p.encoder == "simhash":
        enc = SimHashEncoder(tuple(image_shape), p.bits, p.centre, gen)
    elif p.encoder == "random_conv":
        enc = RandomConvEncoder(channels, p.dim, p.image_size, gen)
    elif p.encoder == "random_projection":
        enc = RandomProjectionEncoder(int(np.prod(image_shape)), p.dim, gen)
    elif p.encoder == "pixels":
        enc = PixelEncoder()
    else:
        enc = MobileNetEncoder(p.weights, p.image_size)
    return enc.eval()


@torch.inference_mode()
def encode(encoder: nn.Module, images: np.ndarray, batch_size: int, dtype: str = "float16",
           device: torch.device | str = "cpu") -> np.ndarray:
    """Hash codes [N, d], L2-normalised so inner product = cosine similarity.

    Normalising here (in float32, before the cast) keeps float16 storage safe: every
    component is in [-1, 1]. A binary encoder (simhash) gives instead uint8 [N, bits/8]:
    the signs of its projections (1 = positive), packed with np.packbits; `dtype` does not
    apply to it.
    """
    encoder = encoder.to(device)
    binary = getattr(encoder, "binary", False)
    out = []
    for start in range(0, len(images), batch_size):
        x = _to_float(images[start : start + batch_size]).to(device)
        if binary:
            out.append(np.packbits((encoder(x) > 0).cpu().numpy(), axis=1))
        else:
            out.append(F.normalize(encoder(x).float(), dim=1).cpu().numpy())
    if binary:
        return np.concatenate(out) if out else np.empty((0, encoder.bits // 8), dtype=np.uint8)
    if not out:
        return np.empty((0, 0), dtype=dtype)
    return np.concatenate(out).astype(dtype)
