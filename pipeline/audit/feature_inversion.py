"""Feature inversion: a curious FedDKC / FedICT server, with a client's final model, turns the per-sample features
the client uploaded back into its images.

Sources: He, Zhang & Lee, "Model Inversion Attacks against Collaborative Inference", ACSAC 2019 (a party holding
an early layer's outputs, and able to query that layer, trains an inverse network on its own (output, input)
pairs and applies it to the victim's outputs: its black-box attack), with the learned inversion of Dosovitskiy &
Brox, "Inverting Visual Representations with Convolutional Networks", CVPR 2016.

What the server holds: FedGKT-style methods (pipeline/federation/gkt.py) upload, every round, each training
sample's stem feature maps (the 16 maps of a 3 x 3 convolution, BatchNorm and ReLU, at the image's own
resolution), its logits and its label. The server does not hold the clients' stems, so the threat model is a
collusion: the server and a party holding one client's final model (the audit's model-holder threat: a stolen
phone, a published personal model). The features a client uploads in the last round come from the extractor
it ends with (its stem after that round's training, in eval mode), so running the final model's stem on public
images (samples no client holds) gives (feature, image) pairs of that very extractor. An inverter trained on
them (pipeline/audit/reconstruction.py, convolutional as the features keep their maps) is applied to the
uploaded features; it never sees a private image.

What this does not claim: a server without any client's model would have to learn the extractor too (e.g.
He et al.'s query-free attack, a shadow extractor trained on public data); that is a weaker attacker, not
measured here. The figure to beat is the mean public image (`reconstruction.mean_image_baseline`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.audit.reconstruction import Inverter, invert, train_inverter

FEATURES = "features"  # the inverter's name for float features read as they are (no packed bits)


def invert_features(extract: Callable[[np.ndarray], np.ndarray], public_images: np.ndarray,
                    private_features: np.ndarray, *, epochs: int = 30, seed: int = 0) -> tuple[np.ndarray, Inverter]:
    """(the images recovered from `private_features`, float32 [n, H, W] in [0, 1]; the inverter).

    `extract(images)`: the feature extractor the attacker can query (uint8 images [N, H, W] -> float features
    [N, c, H, W], as the server receives them: decoded as it decodes the uploads); `public_images`: the images it
    queries it on; `private_features`: the uploaded features [n, c, H, W] to invert.
    """
    public_features = np.asarray(extract(public_images), dtype=np.float32)
    private_features = np.asarray(private_features, dtype=np.float32)
    shape = public_features.shape[1:]
    if private_features.shape[1:] != shape:
        raise ValueError(f"uploaded features {private_features.shape[1:]} differ from the extractor's {shape}")
    inverter = train_inverter(public_features.reshape(len(public_features), -1), public_images, epochs=epochs,
                              seed=seed, encoder_name=FEATURES, feature_shape=shape)
    return invert(inverter, private_features.reshape(len(private_features), -1)), inverter
