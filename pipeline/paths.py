"""Where each stage writes its outputs (all DVC outputs, never committed to git)."""

from pathlib import Path

PARTITION = Path("data/partition/partition.npz")
PARTITION_STATS = Path("data/partition/stats.json")
HASHES = Path("data/hashes/hashes.npy")
HASHES_INFO = Path("data/hashes/info.json")
RELATIONS = Path("data/cache/relations.npy")
CACHE_DIR = Path("data/cache")
