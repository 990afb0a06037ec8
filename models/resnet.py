"""CIFAR-style ResNets used as FedCache's client models A1/A2/A3 (ResNet-8/16/20).

A 3x3 conv stem (16 channels), three stages of BasicBlocks with 16/32/64 channels and
strides 1/2/2, 1x1 conv shortcuts where the shape changes, global average pooling and a
linear head. ResNet-8/16/20 have 1/2/3 blocks per stage. `features()` returns the pooled
penultimate features (FedProto and pDFL need them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURES = {"resnet8": 1, "resnet16": 2, "resnet20": 3}  # blocks per stage
HETERO_CYCLE = ("resnet8", "resnet16", "resnet20")  # client i gets HETERO_CYCLE[i % 3] (A1/A2/A3)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, blocks_per_stage: int, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        stages, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for b in range(blocks_per_stage):
                blocks.append(BasicBlock(cin, cout, stride if b == 0 else 1))
                cin = cout
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(64, num_classes)
        self.feature_dim = 64

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pooled(self.stem(x))

    def pooled(self, stem_out: torch.Tensor) -> torch.Tensor:
        """The penultimate features from the stem's output (FedDKC/FedICT send that output to a server)."""
        return F.adaptive_avg_pool2d(self.stages(stem_out), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_model(name: str, in_channels: int, num_classes: int) -> ResNet:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    return ResNet(ARCHITECTURES[name], in_channels, num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
