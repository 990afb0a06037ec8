"""Local-only training: every client trains on its own data; nothing is exchanged (zero bytes)."""

from __future__ import annotations

from pipeline.federation.contract import LocalUpdate, Server
from pipeline.federation.losses import ce_rows


class LocalClient(LocalUpdate):
    def loss(self, model, step, phase):
        return ce_rows(model(step.x), step.y)


class LocalOnly(Server):
    name = "local"
    client_cls = LocalClient
