"""The peer-to-peer graph of decentralized methods (pDFL): who receives from whom each round.

An Erdős–Rényi graph G(N, p) over the N clients: each undirected pair is an edge with
probability `pdfl.edge_prob`. A draw is kept only when it is connected and every client has at
least `pdfl.min_degree` neighbours; otherwise it is redrawn from the same seeded stream, at most
`pdfl.max_redraws` times, then a ConfigError says which knobs to change.

Time variation (`pdfl.topology`):
  static     one graph for the whole run (stream "topology");
  redraw     a fresh graph every round (stream "topology", round), with the same checks;
  subsample  the static graph, but each round every client receives from a seeded subset of
             ceil(subsample_fraction * degree) of its neighbours (stream "topology-subsample",
             round). The round's graph is then directed: j -> i does not imply i -> j.

Every draw is keyed by (seed, round), so a resumed run sees exactly the graphs an
uninterrupted one would. A round's graph is a list of directed edges (sender, receiver).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.errors import ConfigError
from pipeline.seeds import rng

if TYPE_CHECKING:
    from pipeline.methods.pdfl.params import PDFLParams


def is_connected(adjacency: np.ndarray) -> bool:
    n = len(adjacency)
    import networkx as nx  # here, so the training core imports without it

    return n <= 1 or nx.is_connected(nx.from_numpy_array(adjacency.astype(np.int8)))


def erdos_renyi(n: int, edge_prob: float, min_degree: int, max_redraws: int, gen: np.random.Generator,
                ) -> tuple[np.ndarray, int]:
    """A connected G(n, edge_prob) with every degree >= min_degree: (symmetric bool adjacency [n, n],
    number of draws it took). Raises ConfigError when impossible or not found within max_redraws."""
    if min_degree > n - 1:
        raise ConfigError(f"pdfl.min_degree = {min_degree}: every client needs that many neighbours, but there are "
                          f"only {n} clients (partition.num_clients), so at most {max(n - 1, 0)} are possible; "
                          f"lower pdfl.min_degree")
    upper = np.triu_indices(n, k=1)
    for draw in range(1, max_redraws + 1):
        adjacency = np.zeros((n, n), dtype=bool)
        adjacency[upper] = gen.random(len(upper[0])) < edge_prob
        adjacency |= adjacency.T
        if adjacency.sum(axis=1).min(initial=n) >= min_degree and is_connected(adjacency):
            return adjacency, draw
    raise ConfigError(
        f"pdfl.edge_prob = {edge_prob}, pdfl.min_degree = {min_degree}: no connected Erdős–Rényi graph on {n} "
        f"clients with every degree >= {min_degree} in pdfl.max_redraws = {max_redraws} draws "
        f"(expected degree {edge_prob * (n - 1):.1f}); raise pdfl.edge_prob, lower pdfl.min_degree "
        f"or raise pdfl.max_redraws")


def adjacency_edges(adjacency: np.ndarray) -> np.ndarray:
    """Symmetric or directed bool adjacency (adjacency[j, i]: j sends to i) -> [E, 2] (sender, receiver)."""
    return np.argwhere(adjacency).astype(np.int64)


class Topology:
    """The run's graph(s). `edges(round_)` -> [E, 2] directed (sender, receiver) edges of that round;
    `in_neighbours(round_)[i]` -> the clients i receives from, sorted."""

    def __init__(self, num_clients: int, params: PDFLParams, seed: int):
        self.n = num_clients
        self.p = params
        self.seed = seed
        self.base, self.base_draws = self._draw(rng(seed, "topology"))
        self.history: dict[int, np.ndarray] = {}  # round -> edges, for the rounds that ran (time-varying only)
        self.draws: dict[int, int] = {}

    def _draw(self, gen: np.random.Generator) -> tuple[np.ndarray, int]:
        p = self.p
        return erdos_renyi(self.n, p.edge_prob, p.min_degree, p.max_redraws, gen)

    def adjacency(self, round_: int) -> np.ndarray:
        """[n, n] bool, adjacency[j, i] = i receives from j in this round."""
        kind = self.p.topology
        if kind == "static":
            return self.base
        if kind == "redraw":
            adjacency, self.draws[round_] = self._draw(rng(self.seed, "topology", round_))
            return adjacency
        gen = rng(self.seed, "topology-subsample", round_)
        adjacency = np.zeros_like(self.base)
        for i in range(self.n):  # per client, not per sample: N small draws a round
            nbrs = np.flatnonzero(self.base[:, i])
            keep = max(1, math.ceil(self.p.subsample_fraction * len(nbrs)))
            adjacency[gen.choice(nbrs, keep, replace=False), i] = True
        return adjacency

    def edges(self, round_: int) -> np.ndarray:
        if self.p.topology == "static":
            return adjacency_edges(self.base)
        if round_ not in self.history:
            self.history[round_] = adjacency_edges(self.adjacency(round_))
        return self.history[round_]

    def in_neighbours(self, round_: int) -> list[np.ndarray]:
        e = self.edges(round_)
        order = np.lexsort((e[:, 0], e[:, 1]))  # by receiver, then sender
        e = e[order]
        splits = np.searchsorted(e[:, 1], np.arange(1, self.n))
        return np.split(e[:, 0], splits)

    # -- stored with the run ---------------------------------------------------------

    def to_json(self) -> dict:
        base = adjacency_edges(np.triu(self.base))
        return {
            "num_clients": self.n,
            "kind": self.p.topology,
            "edge_prob": self.p.edge_prob,
            "min_degree": self.p.min_degree,
            "subsample_fraction": self.p.subsample_fraction,
            "seed": self.seed,
            "base_draws": self.base_draws,
            "base_edges": base.tolist(),  # undirected, i < j
            "base_degrees": self.base.sum(axis=1).tolist(),
            # time-varying: the directed (sender, receiver) edges used in each round that ran
            "rounds": {str(r): e.tolist() for r, e in sorted(self.history.items())},
            "draws": {str(r): d for r, d in sorted(self.draws.items())},
        }

    def write(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")))
        os.replace(tmp, path)

    def state_dict(self) -> dict:
        return {"base": self.base.copy(), "base_draws": self.base_draws,
                "history": {r: e.copy() for r, e in self.history.items()}, "draws": dict(self.draws)}

    def load_state_dict(self, state: dict) -> None:
        self.base = state["base"].copy()
        self.base_draws = state["base_draws"]
        self.history = {int(r): e.copy() for r, e in state["history"].items()}
        self.draws = dict(state["draws"])
