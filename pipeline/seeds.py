"""One root seed, split into named streams.

Each consumer asks for its own stream by name ("partition", "encoder", "init", ...), so
changing how one part draws random numbers never reshuffles another part.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch only where a torch generator is asked for: the data stages and the dashboard read
    import torch  # this module (through pipeline.data.partition) without loading torch


def seed_sequence(root_seed: int, name: str, *extra: int) -> np.random.SeedSequence:
    # crc32 is stable across Python runs (unlike hash()), so streams are reproducible.
    return np.random.SeedSequence([root_seed, zlib.crc32(name.encode()), *extra])


def rng(root_seed: int, name: str, *extra: int) -> np.random.Generator:
    return np.random.default_rng(seed_sequence(root_seed, name, *extra))


def torch_generator(root_seed: int, name: str, *extra: int) -> torch.Generator:
    import torch

    seed = int(seed_sequence(root_seed, name, *extra).generate_state(1, np.uint64)[0] >> 1)
    return torch.Generator().manual_seed(seed)
