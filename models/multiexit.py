"""Multi-exit ResNet-20 for FedAlt: three blocks, each with its own classifier exit.

The CIFAR-style ResNet-20 of models/resnet.py (3 BasicBlocks per stage) is cut into M = 3
blocks along its stages: block 1 = stem + stage 1 (16 ch), block 2 = stage 2 (32 ch),
block 3 = stage 3 (64 ch). Every block owns the exit that follows it:

  exits 1, 2: a bottleneck (1x1 conv to `exit_width` channels, BN, ReLU), global average
              pooling and a linear layer to C classes, so every block gives logits of one size;
  exit 3:     the network's own head (global average pooling, linear 64 -> C): the final output.

Parameters and buffers are named `blocks.<i>.body.*` / `blocks.<i>.exit.*` (i = 0, 1, 2), so a
state_dict key tells its block (`block_of`), and "the first m blocks" includes their exits.
`forward` returns the final logits (what evaluation uses); `forward_all` returns all exits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.resnet import ResNet

NUM_BLOCKS = 3


class BottleneckExit(nn.Module):
    def __init__(self, cin: int, width: int, num_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, width, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1))


class FinalExit(nn.Module):
    def __init__(self, head: nn.Linear):
        super().__init__()
        self.fc = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Block(nn.Module):
    def __init__(self, body: nn.Module, exit_: nn.Module):
        super().__init__()
        self.body = body
        self.exit = exit_


class MultiExitResNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 10, blocks_per_stage: int = 3, exit_width: int = 64):
        super().__init__()
        base = ResNet(blocks_per_stage, in_channels, num_classes)  # the same layers and init as ResNet-20
        self.blocks = nn.ModuleList([
            Block(nn.Sequential(base.stem, base.stages[0]), BottleneckExit(16, exit_width, num_classes)),
            Block(base.stages[1], BottleneckExit(32, exit_width, num_classes)),
            Block(base.stages[2], FinalExit(base.head)),
        ])

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[exit 1 logits, exit 2 logits, final logits], each [n, C]."""
        outs = []
        for block in self.blocks:
            x = block.body(x)
            outs.append(block.exit(x))
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block.body(x)
        return self.blocks[-1].exit(x)


def build_multiexit(in_channels: int, num_classes: int) -> MultiExitResNet:
    return MultiExitResNet(in_channels, num_classes)


def block_of(name: str) -> int:
    """1-based block of a state_dict / named_parameters key (`blocks.<i>.…` -> i + 1)."""
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
        raise KeyError(f"{name!r} is not a block parameter of MultiExitResNet")
    return int(parts[1]) + 1


def block_state(state: dict[str, torch.Tensor], block: int) -> dict[str, torch.Tensor]:
    """The entries of a state dict that belong to one (1-based) block, in their order."""
    return {n: t for n, t in state.items() if block_of(n) == block}
