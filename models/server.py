"""A4^S, the server model of the FedCache paper's feature-exchanging baselines (FedDKC, FedICT).

The paper (Table 4) describes it as a ResNet of 588.2K parameters *without* the first
Conv+BN+ReLU block: it reads the 16-channel H x W feature maps the clients' stems produce
(models/resnet.py: `ResNet.stem`) rather than images. FedDKC and FedICT are built on FedGKT's
code, whose server model is this one: a CIFAR-style ResNet-56 of bottleneck blocks (6 per
stage, widths 16/32/64 expanded x4, strides 1/2/2), global average pooling, a linear head.
It has 590,858 parameters for 10 classes: 577.0 K counted in units of 1,024 as the paper
counts A1-A3, 590.9 K in units of 1,000. No ResNet-56 variant we tried gives 588.2 K exactly
(README "FedDKC and FedICT").

For its homogeneous table (Table 5) the paper lists the server model as A3, the clients' own
architecture: `a3` here is ResNet-20 without its stem.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.resnet import ARCHITECTURES, ResNet

FEATURE_CHANNELS = 16  # the clients' stem width: what a server model reads


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ServerResNet(nn.Module):
    """Stem-less bottleneck ResNet: [n, 16, H, W] client features -> [n, num_classes] logits."""

    def __init__(self, blocks_per_stage: int = 6, num_classes: int = 10):
        super().__init__()
        stages, cin = [], FEATURE_CHANNELS
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(blocks_per_stage):
                stages.append(Bottleneck(cin, width, stride if b == 0 else 1))
                cin = width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.head(F.adaptive_avg_pool2d(self.stages(features), 1).flatten(1))


SERVER_MODELS = ("a4s", "a3")


def build_server_model(num_classes: int, name: str = "a4s") -> nn.Module:
    """a4s: A4^S, ResNet-56 (bottleneck, 6 blocks per stage) without the stem (Table 6).
    a3: the clients' A3 (ResNet-20) without its stem, the server model Table 5 lists for the
    homogeneous runs."""
    if name == "a4s":
        return ServerResNet(6, num_classes)
    if name == "a3":
        model = ResNet(ARCHITECTURES["resnet20"], FEATURE_CHANNELS, num_classes)
        model.stem = nn.Identity()  # reads the 16-channel features the clients' stems produce
        return model
    raise ValueError(f"unknown server model {name!r}; choose one of {', '.join(SERVER_MODELS)}")
