"""What the privacy audit reads of a run (flows/audit.py): a bounded, seeded sample of what the server received.

An honest-but-curious server keeps what crosses to it. Training keeps a sample of the same, so that the audit
attacks what a server really held rather than what the code could have sent:
  - the uploads to the server of `audit.clients` clients (drawn once from the "audit" seed stream) at the set-up,
    the first and the last round, as sent (encoded; the audit decodes as the server does), and what the server sent
    them in those rounds (the server knows what it sent: a model update is read against it). A per-sample payload
    (one with `sample_ids` or `labels`: FedCache's hashes and logits, FedDKC/FedICT's features) keeps `audit.rows`
    seeded samples of each client, kind and round (each array cut to their rows: a row per sample, or several, as
    GKT's features send a row per feature map; without sample ids, the kept samples' places among the client's
    rows of that kind, as `positions`; and every label it carried, as `all_labels`: what the server learns of the
    class mix); anything else (a model, per-class statistics) is kept whole;
  - those clients' final models (what a third party holding a client's model has), at the end of the run.
Payloads sent client to client (pDFL) never reach the server and are not kept.

Files, in the run's directory (a DVC output of its training stage):
  audit/uploads-r<round>.pt   {"round", "uploads": {client: [{"kind", "arrays": {name: array}}]}, "downloads": (same)}
  audit/final_models.pt       {"clients": {client: state_dict}}
both written by pipeline.train.checkpoint.save and read with torch.load(weights_only=True) (no code runs).
Disk: at the default (8 clients, 64 rows) a few hundred KB for a logit method; a method uploading its model keeps
8 x 3 models (ResNet-8: 0.3 MB each).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from pipeline.federation.ledger import DOWN, SERVER, SETUP_ROUND, UP, Payload
from pipeline.seeds import rng
from pipeline.train import checkpoint

PER_SAMPLE = ("sample_ids", "labels")  # an upload with one of these arrays has a row per sample
AUDIT_DIR = "audit"


def uploads_file(run_dir: Path, round_: int) -> Path:
    return Path(run_dir) / AUDIT_DIR / f"uploads-r{round_}.pt"


def models_file(run_dir: Path) -> Path:
    return Path(run_dir) / AUDIT_DIR / "final_models.pt"


def _rows(payload: Payload) -> int | None:
    """The number of samples a per-sample payload carries (None: not one)."""
    for name in PER_SAMPLE:
        if name in payload.arrays:
            return len(payload.arrays[name])
    return None


def _as_numpy(array) -> np.ndarray:
    return array.detach().cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)


def _cut(array: np.ndarray, n: int, keep: np.ndarray) -> np.ndarray:
    """The kept samples' rows of one array of a per-sample payload of n samples: a row per sample, or m rows per
    sample in sample order (GKT's features travel a row per feature map: n x channels rows); anything else whole."""
    if not array.ndim or not n or len(array) % n:
        return array
    per_sample = len(array) // n
    return array.reshape(n, per_sample, *array.shape[1:])[keep].reshape(-1, *array.shape[1:])


class Capture:
    """Keeps the audit's sample of uploads as the simulation counts them (Simulation.count calls `seen`), and writes
    each captured round when the trainer has finished it (`flush`)."""

    def __init__(self, seed: int, num_clients: int, clients: int, rows: int, last_round: int) -> None:
        self.seed, self.rows = seed, rows
        chosen = rng(seed, "audit").choice(num_clients, size=min(clients, num_clients), replace=False)
        self.clients = sorted(int(k) for k in chosen)
        self.rounds = {SETUP_ROUND, 1, last_round}
        # round -> direction -> client -> payloads
        self.pending: dict[int, dict[str, dict[int, list[Payload]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(list)))

    def seen(self, round_: int, client: int, direction: str, payload: Payload, peer: int) -> None:
        """A payload the ledger counted: kept when it is between the server and an audited client in a captured
        round (a download from another client carries its `sender`: not the server's)."""
        if peer == SERVER and payload.sender is None and round_ in self.rounds and client in self.clients:
            self.pending[round_][direction][client].append(payload)

    def flush(self, round_: int, run_dir: Path) -> None:
        """Write round `round_`'s sample (a captured round only; a resumed run writes it again)."""
        if round_ not in self.rounds:
            return
        seen = self.pending.pop(round_, {})
        kept = {name: {k: self._sample(round_, k, seen.get(direction, {}).get(k, []), direction) for k in self.clients}
                for name, direction in (("uploads", UP), ("downloads", DOWN))}
        checkpoint.save(uploads_file(run_dir, round_), {"round": round_, **kept})

    def _sample(self, round_: int, client: int, payloads: list[Payload], direction: str) -> list[dict]:
        """The client's payloads of the round, each per-sample kind cut to `rows` rows drawn over all its payloads
        of that kind (the per-step exchange sends one per batch)."""
        totals: dict[str, int] = defaultdict(int)
        for p in payloads:
            totals[p.kind] += _rows(p) or 0
        stream = 0 if direction == UP else 1
        draws = {kind: set(rng(self.seed, "audit", round_, client, stream, i).choice(
                     n, size=min(self.rows, n), replace=False).tolist())
                 for i, (kind, n) in enumerate(sorted(totals.items())) if n}
        offsets: dict[str, int] = defaultdict(int)
        out = []
        for p in payloads:
            n = _rows(p)
            arrays = {name: _as_numpy(a) for name, a in p.arrays.items()}
            if n is not None:
                start = offsets[p.kind]
                offsets[p.kind] += n
                keep = np.array([i - start for i in range(start, start + n) if i in draws.get(p.kind, ())], dtype=np.int64)
                if not len(keep):
                    continue
                labels = arrays.get("labels")
                arrays = {name: _cut(a, n, keep) for name, a in arrays.items()}
                if "sample_ids" not in arrays:  # which samples the kept rows are: their places among the client's
                    arrays["positions"] = keep + start  # rows of that kind in the round (GKT: its training samples)
                if labels is not None:  # every label the server got (the label-mix audit): 8 bytes a sample
                    arrays["all_labels"] = labels
            out.append({"kind": p.kind, "arrays": arrays})
        return out

    def save_models(self, clients, run_dir: Path) -> None:
        """The audited clients' final models (called when the run finishes)."""
        states = {c.id: {n: t.detach().cpu().clone() for n, t in c.model.state_dict().items()}
                  for c in clients if c.id in self.clients}
        checkpoint.save(models_file(run_dir), {"clients": states})


FIX = ("run the run's training stage again with audit.capture: true (`dvc repro -f train@<method>`, "
       "or train-hetero@<method>)")


def load_uploads(run_dir: Path, round_: int) -> dict:
    """{"round", "uploads": {client: [{"kind", "arrays"}]}, "downloads": {...}} of a captured round."""
    return checkpoint.read(uploads_file(run_dir, round_), FIX)


def captured_rounds(run_dir: Path) -> list[int]:
    """The rounds whose uploads the run kept (the set-up, round 1 and the last round), in order."""
    return sorted(int(f.stem.removeprefix("uploads-r")) for f in (Path(run_dir) / AUDIT_DIR).glob("uploads-r*.pt"))


def load_models(run_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """client -> final state_dict, of the audited clients."""
    return checkpoint.read(models_file(run_dir), FIX)["clients"]
