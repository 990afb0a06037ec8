"""Gaussian noise on uploads, with its (epsilon, delta): client-level local differential privacy (`train.dp_noise`).

The mechanism is DP-FedAvg's (McMahan, Ramage, Talwar & Zhang, "Learning Differentially Private Recurrent Language
Models", ICLR 2018): a client's contribution, taken as one vector, is clipped to L2 norm C (`train.dp_clip`), and
Gaussian noise of standard deviation sigma * C (sigma = `train.dp_noise`) is added to every entry. DP-FedAvg adds
the noise to the sum at a trusted server; here each client adds its own before it sends (local DP), so the
honest-but-curious server of docs/privacy.md only ever holds noised values.

What is clipped and noised: every float array of one upload to the server (a round's upload, or one per-step
exchange of FedCache's `live` / `step` consistency), taken together as one vector. For a model (the payload kinds a
method declares as `Noised.change`, pipeline/capabilities.py) that vector is the client's change from the state it
downloaded, not its weights: the server receives download + noised change. Integer arrays (sample and class ids,
labels, counts) travel in the clear, as do the set-up uploads (FedCache's hashes and labels): the guarantee covers the
per-round float uploads only. Shapes and dtypes are kept, so the ledger counts the same bytes with noise or without.

The accountant (`epsilon`) is opacus's RDPAccountant (Renyi DP, Mironov 2017), with two choices:
  - no amplification by subsampling: the server sees every upload of a client on its own (local DP), so each one is
    a release at sample_rate 1, and the steps are the uploads the client made (its rounds with an upload; with a
    per-step exchange, every step's);
  - replace-one neighbours (a client's data swapped for any other): two clipped uploads differ by up to 2C in L2, so
    the noise multiplier relative to that sensitivity is sigma / 2.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.federation.ledger import Payload
from pipeline.seeds import torch_generator


def _is_float(array) -> bool:
    return array.is_floating_point() if isinstance(array, torch.Tensor) else np.issubdtype(array.dtype, np.floating)


def clip_and_noise(vector: torch.Tensor, sigma: float, clip: float, generator: torch.Generator) -> torch.Tensor:
    """`vector` (float64) scaled down to L2 norm `clip` when it is longer, plus N(0, (sigma * clip)^2) per entry."""
    norm = float(vector.norm())
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    noise = torch.randn(vector.shape, generator=generator, dtype=torch.float64)
    return vector * scale + noise * (sigma * clip)


def privatize(payloads: list[Payload], sigma: float, clip: float, generator: torch.Generator,
              change: tuple[str, ...] = (), download: list[Payload] = ()) -> list[Payload]:
    """The payloads as the server receives them: their float arrays (of a `change` kind: minus the download's array of
    the same kind and name) clipped together and noised, in float64, then cast back to each array's dtype (and, for a
    change, added back to the download's). Integer arrays unchanged."""
    bases = {p.kind: p.arrays for p in download if p.kind in change}
    slots = []  # (payload index, array name, the array as a float64 tensor, its base or None)
    for i, p in enumerate(payloads):
        for name, array in p.arrays.items():
            if not _is_float(array):
                continue
            base = None
            if p.kind in change:
                if p.kind not in bases:
                    raise ValueError(f"the upload's {p.kind!r} is declared a change from the download's, but the "
                                     f"download carries {sorted(q.kind for q in download)}")
                base = torch.as_tensor(bases[p.kind][name]).detach().cpu().double()
            value = torch.as_tensor(array).detach().cpu().double()
            slots.append((i, name, value if base is None else value - base, base))
    if not slots:
        return list(payloads)
    noised = clip_and_noise(torch.cat([v.flatten() for _, _, v, _ in slots]), sigma, clip, generator)
    arrays = [dict(p.arrays) for p in payloads]
    at = 0
    for i, name, value, base in slots:
        out = noised[at:at + value.numel()].reshape(value.shape)
        at += value.numel()
        if base is not None:
            out = base + out
        original = payloads[i].arrays[name]
        arrays[i][name] = (out.numpy().astype(original.dtype) if isinstance(original, np.ndarray)
                           else out.to(original.dtype))
    return [Payload(p.kind, a, p.sender, p.receiver) for p, a in zip(payloads, arrays)]


def has_floats(payloads: list[Payload]) -> bool:
    return any(_is_float(a) for p in payloads for a in p.arrays.values())


@dataclass
class UploadNoise:
    """The simulation's noise on uploads (Simulation calls it where an upload leaves its client): the knobs, the seed,
    the method's declaration, and how many noised uploads (releases) each client has made, for the accountant."""

    sigma: float
    clip: float
    delta: float
    seed: int
    change: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.releases: dict[int, int] = {}

    def apply(self, round_: int, client: int, payloads: list[Payload], download: list[Payload] = (),
              index: int = 0) -> list[Payload]:
        """Client `client`'s upload of `round_` (index 0; a per-step exchange's: 1 + its step), noised. The noise is
        seeded by (round, client, index), so every executor and a resumed run draw the same. An upload without a float
        array (nothing to noise) is not a release."""
        if not has_floats(payloads):
            return list(payloads)
        self.releases[client] = self.releases.get(client, 0) + 1
        generator = torch_generator(self.seed, "dp_noise", round_, client, index)
        return privatize(payloads, self.sigma, self.clip, generator, self.change, download)

    def summary(self) -> dict:
        """The run's figures: the knobs, and epsilon at delta of the client that made the most releases (the
        largest epsilon any client has)."""
        most = max(self.releases.values(), default=0)
        return {"dp_noise": self.sigma, "dp_clip": self.clip, "dp_delta": self.delta, "dp_releases": most,
                "dp_epsilon": epsilon(self.sigma, most, self.delta)}

    def state_dict(self) -> dict:
        return {"releases": dict(self.releases)}

    def load_state_dict(self, state: dict) -> None:
        self.releases = {int(k): int(v) for k, v in state.get("releases", {}).items()}


def epsilon(sigma: float, releases: int, delta: float) -> float:
    """Epsilon at `delta` of `releases` uploads each clipped to C and noised with sigma * C (opacus's RDP accountant;
    the module docstring gives its two choices: sample rate 1, noise multiplier sigma / 2). 0 with no release."""
    if releases == 0:
        return 0.0
    from opacus.accountants import RDPAccountant  # only where a run is noised

    accountant = RDPAccountant()
    for _ in range(releases):
        accountant.step(noise_multiplier=sigma / 2, sample_rate=1.0)
    with warnings.catch_warnings():  # at a large epsilon the best order is opacus's smallest: a looser bound, still one
        warnings.filterwarnings("ignore", message="Optimal order is the")
        return float(accountant.get_epsilon(delta))
