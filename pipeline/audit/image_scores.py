"""How close a reconstructed image is to the true one: PSNR and SSIM, per image.

SSIM is Wang, Bovik, Sheikh & Simoncelli, "Image Quality Assessment: From Error Visibility to
Structural Similarity", IEEE Transactions on Image Processing, 2004; PSNR is 10 log10(1 / MSE) for
images in [0, 1]. Both come from scikit-image (`skimage.metrics`), a well-kept implementation, so
the figures are comparable with other papers' tables. No attacker is assumed here: these are the
scores every reconstruction attack in pipeline/audit/ reports.

Window: SSIM is computed over a uniform 7 x 7 window (scikit-image's default). It must be odd and no
larger than the image, so it fits both the 14 x 14 test digits and the 28 x 28 MNIST digits, and the
same window at both sizes keeps the figures comparable. The paper's Gaussian window (sigma 1.5, 11 x 11)
also fits, but at 14 x 14 it would leave only the central 4 x 4 pixels where the window is whole
(scikit-image averages SSIM over those), too few to score a digit.
"""

from __future__ import annotations

import numpy as np

SSIM_WINDOW = 7
# Identical images have infinite PSNR; they score this instead so that a mean over images stays finite
# (an 8-bit image that differs from the truth in one pixel by one level scores about 71 dB at 14 x 14).
PSNR_CAP = 100.0


def as_unit_images(images: np.ndarray) -> np.ndarray:
    """Images as float64 in [0, 1]: uint8 scaled by 1/255; floats must already lie in [0, 1]."""
    images = np.asarray(images)
    if images.dtype == np.uint8:
        return images.astype(np.float64) / 255.0
    if images.dtype.kind != "f":
        raise TypeError(f"images must be uint8 or float in [0, 1], got {images.dtype}")
    images = images.astype(np.float64)
    if images.size and (images.min() < 0.0 or images.max() > 1.0 or not np.isfinite(images).all()):
        raise ValueError(f"float images must lie in [0, 1]; got [{images.min():.3g}, {images.max():.3g}]")
    return images


def psnr_ssim(true: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(PSNR in dB, SSIM) of each reconstructed image against its true image.

    `true` and `rec`: [N, H, W] (grey) or [N, H, W, C] (colour), uint8 or float in [0, 1], same shape.
    Returns two float64 arrays of length N.
    """
    # here, not at the top: scikit-image brings scipy.stats (about 0.9 s), which an audit without images never needs
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    true, rec = as_unit_images(true), as_unit_images(rec)
    if true.shape != rec.shape:
        raise ValueError(f"true images {true.shape} and reconstructions {rec.shape} differ in shape")
    if true.ndim not in (3, 4):
        raise ValueError(f"expected a batch of images [N, H, W] or [N, H, W, C], got shape {true.shape}")
    if min(true.shape[1:3]) < SSIM_WINDOW:
        raise ValueError(f"images of {true.shape[1]} x {true.shape[2]} are smaller than the {SSIM_WINDOW} x "
                         f"{SSIM_WINDOW} SSIM window")
    colour = true.ndim == 4
    psnr = np.empty(len(true))
    ssim = np.empty(len(true))
    for i, (t, r) in enumerate(zip(true, rec)):
        psnr[i] = PSNR_CAP if np.array_equal(t, r) else min(peak_signal_noise_ratio(t, r, data_range=1.0), PSNR_CAP)
        ssim[i] = structural_similarity(t, r, data_range=1.0, win_size=SSIM_WINDOW,
                                        channel_axis=-1 if colour else None)
    return psnr, ssim
