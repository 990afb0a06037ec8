"""FedCache: sample-level knowledge from a server-side cache of neighbours' logits.

Set-up (round 0): each client uploads (sample ids, labels, hash codes) once; the server
already holds the relation table built by the index stage (data/cache/cache.db).

Each round, each selected client trains one local epoch; per batch it uploads the logits of
those sample ids and receives the mean of the latest cached logits of each sample's R
neighbours (pipeline/cache/knowledge.py), then minimises
    CE(student, y) + beta * T^2 * KL(softmax(teacher/T) || softmax(student/T)).
At the end of the round the knowledge table of the SQL store is written in one transaction.

Bytes per batch of b samples with C classes: up = b*8 (int64 ids) + b*C*4 (float32 logits),
down = b*C*4 (float32 teacher logits). Set-up: n*8 (ids) + n*8 (labels) + n*d*s (codes of
dimension d stored with s bytes per value).
"""

from __future__ import annotations

import shutil

import numpy as np
import torch
import torch.nn.functional as F

from pipeline import paths
from pipeline.algorithms.base import Algorithm
from pipeline.cache import store
from pipeline.cache.knowledge import KnowledgeCache
from pipeline.comm import DOWN, SETUP_ROUND, UP, Payload
from pipeline.engine import Context, kd_loss


class FedCache(Algorithm):
    name = "fedcache"

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.p = ctx.params.fedcache
        source_db = ctx.params.cache_db_path
        relations = store.read_relations(source_db)  # the server's IR map
        if len(relations) != ctx.partition.num_train:
            raise store.CacheStoreError(f"{source_db} holds {len(relations)} samples, the partition {ctx.partition.num_train}: "
                                        "rerun dvc repro index")
        self.cache = KnowledgeCache(torch.from_numpy(relations), ctx.num_classes, self.p.consistency, self.p.cold_start)
        # The run keeps its own copy of the cache DB: the index stage's output stays untouched.
        self.db_path = ctx.run_dir / "cache.db"
        shutil.copyfile(source_db, self.db_path)
        self.db = store.engine_for(self.db_path)

    def setup(self) -> None:
        codes = np.load(paths.HASHES)
        part = self.ctx.partition
        for client in self.ctx.clients:
            ids = client.ids.numpy()
            self.ctx.ledger.record(SETUP_ROUND, client.id, UP, Payload("hashes", {
                "sample_ids": ids, "labels": part.train_labels[ids], "codes": codes[ids]}))

    def exchange(self, round_: int, client_id: int, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Upload a batch's logits, get back its neighbours' mean knowledge (NaN rows: no teacher yet)."""
        ledger = self.ctx.ledger
        with self.ctx.timer("exchange"):
            up = ledger.record(round_, client_id, UP, Payload("logits", {"sample_ids": ids, "logits": logits.detach().cpu()}))
            teacher = self.cache.fetch(up.arrays["sample_ids"])
            self.cache.update(up.arrays["sample_ids"], up.arrays["logits"], round_)
            down = ledger.record(round_, client_id, DOWN, Payload("knowledge", {"teacher": teacher}))
            return down.arrays["teacher"].to(logits.device)

    def train_round(self, round_: int, selected: list[int]) -> None:
        self.cache.begin_round()
        for k in selected:
            client = self.ctx.clients[k]
            client.model.train()
            for x, y, ids in self.ctx.batches(client, round_):
                logits = client.model(x)
                teacher = self.exchange(round_, k, ids, logits)
                loss = F.cross_entropy(logits, y) + self.p.beta * kd_loss(logits, teacher, self.p.T)
                client.step(loss)

    def end_round(self, round_: int) -> None:
        self._persist(self.cache.updated_in == round_)

    def _persist(self, mask: torch.Tensor) -> None:
        ids = torch.nonzero(mask).flatten()
        if len(ids):
            store.write_knowledge(self.db, ids.numpy(), self.cache.logits[ids].numpy(), self.cache.updated_in[ids].numpy())

    def state_dict(self) -> dict:
        return {"cache": self.cache.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.cache.load_state_dict(state["cache"])
        # the run's DB copy was re-made from the index output: bring its knowledge table up to date
        self._persist(self.cache.updated_in >= 0)
