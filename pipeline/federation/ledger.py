"""The byte ledger: every payload that crosses client <-> server is counted.

A payload is a small named message (like Flower's typed messages): a kind plus the arrays
that actually travel. Its size is the sum of those arrays' nbytes, ids included, so the
ledger measures what is sent rather than estimating it. Counts are kept per
(round, client, direction, kind, peer). Round 0 is set-up: everything sent then is one-time
traffic (FedCache's hash upload), so totals can be shown with and without it; this is the one
definition of set-up bytes that summaries, the report and the dashboard share.

`client` is the client whose traffic it is: "up" = sent by it, "down" = received by it.
`peer` is the other end: -1 for the server; in decentralized methods (pDFL) the receiving
client of a directed edge, recorded once, on the sender's side, as "up".

With a simulated clock (pipeline/federation/clock.py) each row also carries the simulated instant
its payload completed (`stamp`; the latest, when several payloads share a row); without one, None.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

UP, DOWN = "up", "down"
SERVER = -1
SETUP_ROUND = 0


def nbytes(array: torch.Tensor | np.ndarray) -> int:
    if isinstance(array, torch.Tensor):
        return array.numel() * array.element_size()
    return int(array.nbytes)


@dataclass(frozen=True)
class Payload:
    """What one message carries: a kind and named arrays. `sender` is set on what a client
    receives from another client (decentralized methods) rather than from the server; `receiver` on what
    a client relays to one peer (pDFL's feedback copy; None: whichever peers receive it)."""

    kind: str
    arrays: dict[str, torch.Tensor | np.ndarray]
    sender: int | None = None
    receiver: int | None = None

    @property
    def nbytes(self) -> int:
        return sum(nbytes(a) for a in self.arrays.values())


@dataclass
class Ledger:
    # round -> (client, direction, kind, peer) -> bytes. Indexed by round so that a round's rows and
    # totals cost the size of that round, not of the whole run (1,000 rounds at K=300 add up).
    counts: dict[int, dict[tuple[int, str, str, int], int]] = field(default_factory=dict)
    # running totals over the run: (direction, is_setup_round) -> bytes
    grand: dict[tuple[str, bool], int] = field(default_factory=lambda: defaultdict(int))
    # round -> (client, direction, kind, peer) -> simulated seconds when the row's last payload completed
    times: dict[int, dict[tuple[int, str, str, int], float]] = field(default_factory=dict)

    def record(self, round_: int, client: int, direction: str, payload: Payload, peer: int = SERVER) -> Payload:
        """Count a payload as sent; returns it so a send reads as one expression."""
        n = payload.nbytes
        in_round = self.counts.setdefault(round_, defaultdict(int))
        in_round[(client, direction, payload.kind, peer)] += n
        self.grand[(direction, round_ == SETUP_ROUND)] += n
        return payload

    def stamp(self, round_: int, client: int, direction: str, kind: str, at: float, peer: int = SERVER) -> None:
        """The simulated instant a recorded row's payload completed (a row keeps its latest)."""
        key = (client, direction, kind, peer)
        if key not in self.counts.get(round_, {}):
            raise KeyError(f"no ledger row {key} in round {round_} to stamp")
        in_round = self.times.setdefault(round_, {})
        in_round[key] = max(in_round.get(key, at), at)

    def timed_rows(self, round_: int) -> list[tuple[int, int, str, str, int, int, float | None]]:
        """rows() with each row's simulated instant (None: not stamped, e.g. no clock)."""
        times = self.times.get(round_, {})
        return [(*row, times.get((row[1], row[2], row[3], row[5]))) for row in self.rows(round_)]

    def rows(self, round_: int) -> list[tuple[int, int, str, str, int, int]]:
        """(round, client, direction, kind, bytes, peer) rows of one round, sorted."""
        return sorted((round_, c, d, k, b, p) for (c, d, k, p), b in self.counts.get(round_, {}).items())

    def total(self, round_: int | None = None, direction: str | None = None, setup: bool = True) -> int:
        if round_ is None:
            return sum(b for (d, is_setup), b in self.grand.items()
                       if (direction is None or d == direction) and (setup or not is_setup))
        if round_ == SETUP_ROUND and not setup:
            return 0
        return sum(b for (_, d, _, _), b in self.counts.get(round_, {}).items() if direction is None or d == direction)

    def state_dict(self) -> dict:
        return {"counts": {r: dict(c) for r, c in self.counts.items()}, "grand": dict(self.grand),
                "times": {r: dict(t) for r, t in self.times.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.counts = {r: defaultdict(int, c) for r, c in state["counts"].items()}
        self.grand = defaultdict(int, state["grand"])
        self.times = {r: dict(t) for r, t in state.get("times", {}).items()}
