"""Reading the encode stage's hash codes (data/hashes/hashes.npy) with a clear answer when damaged."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.errors import InputFileError


def load_hashes(path: Path, num_samples: int | None) -> np.ndarray:
    """The codes, checked: a readable 2-D array with one row per training sample (num_samples; None:
    any number), either float [N, d] (cosine codes) or uint8 [N, bits/8] (a binary encoder's packed sign bits)."""
    path = Path(path)
    fix = "rebuild it: .venv/bin/dvc repro -f encode"
    if not path.is_file():
        raise InputFileError(f"{path} not found: run the encode stage first (.venv/bin/dvc repro encode)")
    try:
        codes = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise InputFileError(f"{path} is damaged or not a hashes file ({type(err).__name__}: {err}); {fix}") from None
    wrong_count = num_samples is not None and len(codes) != num_samples
    if codes.ndim != 2 or not (codes.dtype.kind == "f" or codes.dtype == np.uint8) or wrong_count or codes.shape[1] == 0:
        expected = "" if num_samples is None else f" ({num_samples})"
        raise InputFileError(f"{path} holds {codes.dtype} codes of shape {codes.shape}, expected one float row per "
                             f"training sample{expected}, or one uint8 row of packed sign bits; {fix}")
    return codes
