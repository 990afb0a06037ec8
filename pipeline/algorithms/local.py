"""Local-only training: every client trains on its own data; nothing is exchanged (zero bytes)."""

from __future__ import annotations

import torch.nn.functional as F

from pipeline.algorithms.base import Algorithm


class LocalOnly(Algorithm):
    name = "local"

    def train_round(self, round_: int, selected: list[int]) -> None:
        for k in selected:
            client = self.ctx.clients[k]
            client.model.train()
            for x, y, _ in self.ctx.batches(client, round_):
                client.step(F.cross_entropy(client.model(x), y))
