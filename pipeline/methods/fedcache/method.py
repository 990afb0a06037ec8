"""FedCache: sample-level knowledge from a server-side cache of neighbours' logits.

Set-up (round 0): each client uploads (sample ids, labels, hash codes) once, its rows of the
encode stage's output; the server already holds the relation table the index stage built from
them (data/cache/cache.db).

Each round, each selected client trains one local epoch on
    CE(student, y) + beta * T^2 * KL(softmax(teacher/T) || softmax(student/T)),
the teacher of a sample being the mean of the latest cached logits of its R neighbours
(pipeline/methods/fedcache/knowledge.py). When the teacher is read depends on `consistency`:
  live   per batch, through the per-step exchange hook: the client uploads the batch's logits
         and gets back its teachers as the cache is now (the official code; sequential executor);
  step   the same per-batch exchange, but all clients take each local step together and read
         the cache as it stood after the previous step (vectorized executor);
  round  the download carries the teachers of all the client's samples from the round-start
         cache; the upload carries each sample's logits from its (last) training step.
At the end of the round the knowledge table of the SQL store is written in one transaction.

Bytes with C classes: per sample and visit, up = 8 (int64 id) + 4C (float32 logits), down = 4C
(float32 teacher); with one local epoch every consistency sends the same bytes. Set-up: n*8
(ids) + n*8 (labels) + n*d*s (codes of dimension d stored with s bytes per value).
`encode_up` and `encode_down` encode the logits and the teachers (pipeline/encoding_spec.py; the ids travel as
they are): the ledger counts the encoded parts, and each side decodes before use. A delta encoding keeps, on the
sender, the receiver's copy: the client its logits as the cache holds them, the server each client's teachers as
the client last decoded them; it needs round consistency (live and step exchange per batch).

Per evaluated round the run records what the cache holds at the round's end, over all training
samples (KnowledgeCache.stats; the dashboard's Cache tab): cache_coverage (share of samples with a
teacher), cache_staleness (mean age in rounds of the neighbour knowledge teachers are built from),
cache_teacher_acc (share of teachers whose argmax is the sample's label, from the labels of the
set-up upload) and cache_teacher_entropy (mean entropy in nats of softmax(teacher / fedcache.T)).
"""

from __future__ import annotations

import shutil

import numpy as np
import torch

from pipeline import paths
from pipeline.errors import InputFileError
from pipeline.encoding_spec import parse as parse_encoding
from pipeline.federation.contract import LocalUpdate, Server, ServerContext, Upload, Wire
from pipeline.federation.encoding import decode, encode, row_bytes
from pipeline.federation.ledger import Payload
from pipeline.index.hashes import load_hashes
from pipeline.methods.fedcache.knowledge import KnowledgeCache
from pipeline.federation.losses import ce_rows, kd_rows


class FedCacheClient(LocalUpdate):
    def __init__(self, params, num_classes):
        super().__init__(params, num_classes)
        self.p = params.fedcache
        self.uses_exchange = self.p.consistency != "round"
        self.up, self.down = parse_encoding(self.p.encode_up), parse_encoding(self.p.encode_down)

    def setup(self, client):
        """The hash codes of the client's samples (its rows of the encode stage's output), once."""
        codes = load_hashes(paths.HASHES, None)
        ids = client.ids.numpy()
        if len(ids) and ids.max() >= len(codes):
            raise InputFileError(f"{paths.HASHES} holds {len(codes)} codes, but client {client.id} holds sample id "
                                 f"{ids.max()}: rebuild it for this partition (.venv/bin/dvc repro encode)")
        return Upload([Payload("hashes", {"sample_ids": ids, "labels": client.y_train.cpu().numpy(),
                                          "codes": codes[ids]})])

    def begin(self, client, download, round_):
        if self.p.consistency != "round":
            return {}
        (knowledge,) = download
        held = client.state.get("teacher_copy")  # what a delta encoding leaves as it was (NaN: nothing yet)
        if held is None and self.down.kind == "delta":
            held = torch.full((client.num_train, self.num_classes), float("nan"), dtype=client.x_train.dtype)
        teacher = decode(self.down, "teacher", knowledge.arrays, held=held, columns=self.num_classes)
        if self.down.kind == "delta":
            client.state["teacher_copy"] = teacher.clone()
        return {"teacher": teacher.to(client.x_train.device, client.x_train.dtype)}

    def loss(self, model, step, phase):
        logits = model(step.x)
        if "teacher" in step.t:  # round: from the download
            teacher = step.t["teacher"]
            step.record("logits", logits)
        else:  # live / step: upload this batch's logits, get back its teachers (encoded both ways)
            sent = encode(self.up, "logits", logits.detach()).parts
            answer = step.exchange(Payload("logits", {"sample_ids": step.ids, **sent}))
            teacher = decode(self.down, "teacher", answer, columns=self.num_classes).to(logits.device, logits.dtype)
        return ce_rows(logits, step.y) + self.p.beta * kd_rows(logits, teacher, self.p.T)

    def end(self, client, targets, records, round_):
        if "logits" not in records:
            return Upload()
        idx, logits = records["logits"]
        visit = torch.arange(len(idx))
        # a sample visited more than once (local_epochs > 1) sends the logits of its last visit
        latest = torch.full((client.num_train,), -1, dtype=torch.long).scatter_reduce(0, idx, visit, "amax")
        sent = idx[latest[idx] == visit]
        order = latest[sent]
        rows = logits[order.to(logits.device)].cpu()
        copy = client.state.get("logits_copy")  # the cache's copy of this client's logits (a delta encoding's)
        held = None if copy is None else copy[sent]
        enc = encode(self.up, "logits", rows, held=held)
        if self.up.kind == "delta":
            if copy is None:
                copy = torch.full((client.num_train, rows.shape[1]), float("nan"), dtype=rows.dtype)
            copy[sent] = enc.decoded
            client.state["logits_copy"] = copy
        return Upload([Payload("logits", {"sample_ids": client.ids[sent], **enc.parts})])


class FedCache(Server):
    name = "fedcache"
    client_cls = FedCacheClient

    def __init__(self, ctx: ServerContext):
        super().__init__(ctx)
        self.p = ctx.params.fedcache
        relations = self.load_relations()  # the server's IR map
        self.cache = KnowledgeCache(torch.from_numpy(relations), ctx.num_classes, self.p.consistency, self.p.cold_start)
        self.db = self.open_store()
        self.labels: torch.Tensor | None = None  # every sample's label, from the set-up upload (setup)
        self.up, self.down = parse_encoding(self.p.encode_up), parse_encoding(self.p.encode_down)
        self.sent: dict[int, torch.Tensor] = {}  # delta down: each client's teachers as it decoded them last

    # The SQL store (SQLAlchemy) is imported where it is used, so the training core runs without it
    # (bench/gpu_check.sh overrides these two on a machine with torch and numpy only).

    def load_relations(self) -> np.ndarray:
        from pipeline.index import store

        source_db = self.ctx.params.cache_db_path
        relations = store.read_relations(source_db)
        if len(relations) != self.ctx.partition.num_train:
            raise store.CacheStoreError(f"{source_db} holds {len(relations)} samples, the partition "
                                        f"{self.ctx.partition.num_train}: rerun dvc repro index")
        return relations

    def open_store(self):
        """The run's own copy of the cache DB (the index stage's output stays untouched)."""
        from pipeline.index import store

        db_path = self.ctx.run_dir / "cache.db"
        shutil.copyfile(self.ctx.params.cache_db_path, db_path)
        return store.engine_for(db_path)

    @classmethod
    def inputs(cls):
        return [paths.PARTITION, paths.RELATIONS]

    def wire(self, k):
        n, C = len(self.ctx.client_sample_ids(k)), self.ctx.num_classes
        codes = np.load(paths.HASHES, mmap_mode="r")  # a row of the encode stage's codes: d values of s bytes
        visits = n if self.p.consistency == "round" else n * self.ctx.params.train.local_epochs
        up, down = row_bytes(self.up, C), row_bytes(self.down, C)
        # a delta's bytes depend on what moved: at most a bitmap and every row, in whole bytes
        up_wire = Wire(8 + up, visits) if up else Wire(1, visits * (8 + 4 * C) + -(-visits // 8), exact=False)
        down_wire = Wire(down, visits) if down else Wire(1, visits * 4 * C + -(-visits // 8), exact=False)
        return {("up", "hashes"): Wire(8 + 8 + codes.shape[1] * codes.dtype.itemsize, n),
                ("up", "logits"): up_wire, ("down", "knowledge"): down_wire}

    def setup(self, uploads):
        """The labels the clients announce with their hash codes: what the teacher accuracy is measured on."""
        labels = torch.full((self.ctx.partition.num_train,), -1, dtype=torch.long)
        for up in uploads.values():
            for p in up.payloads:
                if p.kind == "hashes":
                    labels[torch.as_tensor(p.arrays["sample_ids"]).long()] = torch.as_tensor(p.arrays["labels"]).long()
        self.labels = labels

    def configure(self, round_, selected):
        self.cache.begin_round()
        if self.p.consistency != "round":
            return {k: [] for k in selected}
        return {k: [Payload("knowledge", self._teachers_for(k))] for k in selected}

    def _teachers_for(self, k: int) -> dict[str, torch.Tensor]:
        """Client k's teachers from the round-start cache, encoded (a delta against what k decoded last)."""
        enc = encode(self.down, "teacher", self._fetch(self.ctx.client_sample_ids(k)), held=self.sent.get(k))
        if self.down.kind == "delta":
            self.sent[k] = enc.decoded
        return enc.parts

    def _fetch(self, ids: torch.Tensor) -> torch.Tensor:
        """The teachers of these samples from the cache, the server's work noted: per teacher, its R neighbours'
        C logits weighted and summed (2RC), their weights summed (R) and the C sums divided."""
        R, C = self.cache.relations.shape[1], self.ctx.num_classes
        self.count_work(len(ids) * (2 * R * C + R + C))
        return self.cache.fetch(ids)

    def exchange(self, round_, uploads):
        downloads = {}
        for k, up in uploads.items():
            ids = up.arrays["sample_ids"]
            downloads[k] = Payload("knowledge", encode(self.down, "teacher", self._fetch(ids)).parts)
            self.cache.update(ids, decode(self.up, "logits", up.arrays, columns=self.ctx.num_classes), round_)
        return downloads

    def end_step(self):
        self.cache.end_step()

    def aggregate(self, round_, uploads):
        for up in uploads.values():
            for p in up.payloads:
                ids = torch.as_tensor(p.arrays["sample_ids"])
                self.cache.update(ids, decode(self.up, "logits", p.arrays, held=self._held(ids),
                                              columns=self.ctx.num_classes), round_)

    def _held(self, ids: torch.Tensor) -> torch.Tensor | None:
        """What the cache holds of these samples (NaN rows: nothing yet): a delta upload's unsent rows."""
        if self.up.kind != "delta":
            return None
        known = self.cache.known[ids]
        return torch.where(known[:, None], self.cache.logits[ids], torch.full_like(self.cache.logits[ids], float("nan")))

    def report(self, round_, evaluations):
        """The accuracy rows, and the cache at the end of the round (after aggregate) as extra round metrics."""
        rows, extras = super().report(round_, evaluations)
        return rows, {**extras, **self.cache.stats(round_, self.labels, self.p.T)}

    def end_round(self, round_: int) -> None:
        self._persist(self.cache.updated_in == round_)

    def _persist(self, mask: torch.Tensor) -> None:
        from pipeline.index import store

        ids = torch.nonzero(mask).flatten()
        if self.db is not None and len(ids):
            store.write_knowledge(self.db, ids.numpy(), self.cache.logits[ids].numpy(), self.cache.updated_in[ids].numpy())

    def state_dict(self) -> dict:
        return {"cache": self.cache.state_dict(), "labels": self.labels, "sent": dict(self.sent)}

    def load_state_dict(self, state: dict) -> None:
        self.cache.load_state_dict(state["cache"])
        self.labels = state.get("labels")
        self.sent = dict(state.get("sent", {}))
        if self.labels is None:  # a checkpoint from before the labels were kept: the partition's, as announced
            self.labels = torch.from_numpy(np.asarray(self.ctx.partition.train_labels)).long()
        # the run's DB copy was re-made from the index output: bring its knowledge table up to date
        self._persist(self.cache.updated_in >= 0)
