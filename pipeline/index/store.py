"""The knowledge cache at rest: SQLite through SQLAlchemy 2.

Tables follow the paper's maps:
  samples     sample_id -> (client_id, local_index, label, hash)   IH and LI
  neighbours  (sample_id, rank) -> neighbour_id                     IR
  knowledge   sample_id -> (round, logits)                          IK
  cache_meta  key -> value (num_classes, hash format/dtype/dim/bytes, R, ...)

During training the cache is a tensor ([N, C] logits, [N, R] ids); this store is written
once per round in one transaction, so a killed run resumes from the last committed round.
Arrays travel as raw little-endian bytes (float16/float32 blobs), never per-sample queries.
A binary hash (the simhash encoder) is stored as its packed bytes: hash_format "binary",
hash_dim = bits, hash_dtype uint8, hash_bytes = bits/8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy import (
    Column, Engine, Integer, LargeBinary, MetaData, String, Table, create_engine, func, insert, select, update, bindparam,
)

from pipeline.errors import UserError

metadata = MetaData()

samples = Table(
    "samples", metadata,
    Column("sample_id", Integer, primary_key=True),
    Column("client_id", Integer, nullable=False, index=True),
    Column("local_index", Integer, nullable=False),
    Column("label", Integer, nullable=False, index=True),
    Column("hash", LargeBinary, nullable=False),
)
neighbours = Table(
    "neighbours", metadata,
    Column("sample_id", Integer, primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("neighbour_id", Integer, nullable=False),
)
knowledge = Table(
    "knowledge", metadata,
    Column("sample_id", Integer, primary_key=True),
    Column("round", Integer, nullable=False),  # -1: never uploaded (the zero vector of eq. 9)
    Column("logits", LargeBinary, nullable=False),  # float32 [C]
)
cache_meta = Table(
    "cache_meta", metadata,
    Column("key", String, primary_key=True),
    Column("value", String, nullable=False),
)

LOGIT_DTYPE = np.float32


class CacheStoreError(UserError, RuntimeError):
    pass


def engine_for(path: str | Path) -> Engine:
    return create_engine(f"sqlite:///{Path(path)}")


def create_cache(path: Path, clients: np.ndarray, local_index: np.ndarray, labels: np.ndarray,
                 codes: np.ndarray, relations: np.ndarray, num_classes: int, meta: dict[str, str]) -> None:
    """Write a fresh cache DB atomically (to a temporary file, renamed when complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    engine = engine_for(tmp)
    try:
        metadata.create_all(engine)
        n, R = relations.shape
        zeros = np.zeros(num_classes, LOGIT_DTYPE).tobytes()
        codes = np.ascontiguousarray(codes)
        with engine.begin() as conn:
            conn.execute(insert(samples), [
                {"sample_id": i, "client_id": c, "local_index": li, "label": y, "hash": h.tobytes()}
                for i, (c, li, y, h) in enumerate(zip(clients.tolist(), local_index.tolist(), labels.tolist(), codes))
            ])
            ids = np.repeat(np.arange(n), R)
            ranks = np.tile(np.arange(R), n)
            conn.execute(insert(neighbours), [
                {"sample_id": s, "rank": r, "neighbour_id": nb}
                for s, r, nb in zip(ids.tolist(), ranks.tolist(), relations.ravel().tolist())
            ])
            conn.execute(insert(knowledge), [{"sample_id": i, "round": -1, "logits": zeros} for i in range(n)])
            binary = codes.dtype == np.uint8  # packed sign bits
            full_meta = {"num_samples": str(n), "num_classes": str(num_classes), "R": str(R),
                         "hash_format": "binary" if binary else "float",
                         "hash_dim": str(codes.shape[1] * (8 if binary else 1)), "hash_dtype": str(codes.dtype),
                         "hash_bytes": str(codes.shape[1] * codes.dtype.itemsize), **meta}
            conn.execute(insert(cache_meta), [{"key": k, "value": v} for k, v in full_meta.items()])
    finally:
        engine.dispose()
    tmp.replace(path)


def _require(path: Path) -> Engine:
    """An engine on an existing knowledge-cache DB; a damaged or foreign file is a CacheStoreError."""
    if not Path(path).is_file():
        raise CacheStoreError(f"knowledge cache {path} not found: run the index stage first (dvc repro index)")
    engine = engine_for(path)
    try:
        with engine.connect() as conn:  # every reader needs these tables: check them before any work
            for table in (cache_meta, samples, neighbours):
                conn.execute(select(func.count()).select_from(table)).scalar_one()
    except SQLAlchemyError as err:
        engine.dispose()
        why = str(getattr(err, "orig", err)).splitlines()[0]
        raise CacheStoreError(f"{path} is damaged or not a knowledge-cache database ({why}); "
                              "rebuild it: .venv/bin/dvc repro -f index") from None
    return engine


def read_meta(path: Path) -> dict[str, str]:
    engine = _require(path)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(select(cache_meta.c.key, cache_meta.c.value)).all())
    finally:
        engine.dispose()


def read_relations(path: Path) -> np.ndarray:
    """The IR map as an [N, R] int64 array of global sample ids."""
    engine = _require(path)
    try:
        with engine.connect() as conn:
            n = conn.execute(select(func.count()).select_from(samples)).scalar_one()
            rows = conn.execute(select(neighbours.c.neighbour_id).order_by(neighbours.c.sample_id, neighbours.c.rank)).scalars().all()
    finally:
        engine.dispose()
    if n == 0 or len(rows) % n:
        raise CacheStoreError(f"{path}: neighbours table has {len(rows)} rows for {n} samples; rebuild with dvc repro index")
    return np.asarray(rows, dtype=np.int64).reshape(n, len(rows) // n)


def read_samples(path: Path) -> dict[str, np.ndarray]:
    """IH/LI maps as arrays ordered by sample id: client_id, local_index, label, hash
    (float [N, d], or uint8 [N, bits/8] packed sign bits for a binary hash)."""
    engine = _require(path)
    meta = read_meta(path)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(samples).order_by(samples.c.sample_id)).all()
    finally:
        engine.dispose()
    dtype, dim = np.dtype(meta["hash_dtype"]), int(meta["hash_dim"])
    if meta.get("hash_format") == "binary":
        dim //= 8  # hash_dim counts bits; a row holds bits/8 bytes
    return {
        "sample_id": np.array([r.sample_id for r in rows], dtype=np.int64),
        "client_id": np.array([r.client_id for r in rows], dtype=np.int64),
        "local_index": np.array([r.local_index for r in rows], dtype=np.int64),
        "label": np.array([r.label for r in rows], dtype=np.int64),
        "hash": np.frombuffer(b"".join(r.hash for r in rows), dtype=dtype).reshape(len(rows), dim),
    }


def read_knowledge(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """IK map: (logits [N, C] float32, round [N] int; -1 = never uploaded)."""
    engine = _require(path)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(knowledge.c.round, knowledge.c.logits).order_by(knowledge.c.sample_id)).all()
    finally:
        engine.dispose()
    rounds = np.array([r[0] for r in rows], dtype=np.int64)
    logits = np.frombuffer(b"".join(r[1] for r in rows), dtype=LOGIT_DTYPE).reshape(len(rows), -1).copy()
    return logits, rounds


def write_knowledge(engine: Engine, sample_ids: np.ndarray, logits: np.ndarray, rounds: int | np.ndarray) -> None:
    """Store the latest knowledge of these samples in one transaction (one round's commit).

    `rounds`: the round each sample's logits were uploaded in (one int for all, or per sample).
    """
    logits = np.ascontiguousarray(logits, dtype=LOGIT_DTYPE)
    rounds = np.broadcast_to(np.asarray(rounds, dtype=np.int64), (len(sample_ids),))
    stmt = update(knowledge).where(knowledge.c.sample_id == bindparam("sid")).values(
        round=bindparam("rnd"), logits=bindparam("blob"))
    with engine.begin() as conn:
        conn.execute(stmt, [{"sid": s, "rnd": r, "blob": row.tobytes()}
                                  for s, r, row in zip(sample_ids.tolist(), rounds.tolist(), logits)])
