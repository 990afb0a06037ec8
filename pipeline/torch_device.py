"""Which torch device the simulation computes on (`device:` in params.yaml): `auto` uses CUDA when present; everything
also runs on the CPU. (The simulated devices the clients train on are pipeline/federation/devices.py's.)"""

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but no CUDA device is available; use device: auto or cpu")
    return torch.device(name)
