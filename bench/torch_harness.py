"""FedCache rounds with torch and numpy alone, for the executor benchmarks (here and on a GPU).

A bare GPU machine has none of the service libraries (no pydantic, SQLAlchemy, faiss, DuckDB),
so this builds what the pipeline's stages would (a Dirichlet partition, hashes, per-label
neighbours) with numpy/torch and runs the library's own round (`pipeline.train.engine.Simulation`)
with the library's FedCache, executors and clients. What differs from a pipeline run, and
does not change a round's cost: the hash is a seeded random projection of the pixels (not
HOG), neighbours come from an exact torch top-k per label (not faiss), and the knowledge
table is not written to SQLite. The settings are written out here (batch 8, lr 0.01,
momentum 0.9, weight decay 5e-4, beta 1.5, T 3, R 16: params.yaml's defaults).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.data.datasets import ImageDataset, load_dataset  # noqa: E402
from pipeline.data.partition import Partition, make_partition  # noqa: E402
from pipeline.federation.clients import build_clients  # noqa: E402
from pipeline.federation.contract import Server, ServerContext  # noqa: E402
from pipeline.methods.fedcache.method import FedCache  # noqa: E402
from pipeline.train.engine import Simulation, Timer  # noqa: E402
from pipeline.train.executors import SequentialExecutor  # noqa: E402

SETTINGS = {
    # the official code's setting: K = 20 over all 60,000 FashionMNIST samples, A1/A2/A3 by client index
    "official": dict(num_clients=20, hetero=True, model="resnet8"),
    # the paper's: K = 300, ResNet-20 (A3) on every client
    "paper": dict(num_clients=300, hetero=False, model="resnet20"),
    # params.yaml's default: K = 30 x 200 samples, ResNet-8
    "default": dict(num_clients=30, hetero=False, model="resnet8", samples_per_client=200),
    # a small one for quick checks
    "small": dict(num_clients=20, hetero=False, model="resnet8", samples_per_client=100),
    # a smoke test's (bench/roofline.py --harness --quick): K = 4 x 50 samples, 5% of the test set
    "quick": dict(num_clients=4, hetero=False, model="resnet8", samples_per_client=50, test_fraction=0.05),
}


def scaled_setting(num_clients: int, hetero: bool, samples_per_client: int | None = 200, model: str = "resnet8"
                   ) -> dict:
    """A setting like SETTINGS' at any K (bench/scaling.py): `model` on every client, or A1/A2/A3 by client
    index when hetero; samples_per_client None uses all 60,000 samples."""
    return {"num_clients": num_clients, "hetero": hetero, "model": model, "samples_per_client": samples_per_client}


def _setting(setting: str | dict) -> dict:
    """A SETTINGS name, or a setting dict itself (scaled_setting)."""
    return SETTINGS[setting] if isinstance(setting, str) else setting


def bench_params(model: str, consistency: str, group_size: int, seed: int = 0,
                 precision: str = "float32") -> SimpleNamespace:
    # rounds: params.yaml's 30; a benchmark's few timed rounds never reach the last, whose final downloads
    # belong to the run's end, not to a round
    train = SimpleNamespace(lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=8, local_epochs=1,
                            eval_batch_size=512, model=model, group_size=group_size, executor="vectorized",
                            fresh_optimizer=False, rounds=30, schedule="sync", precision=precision,
                            dp_noise=0.0, dp_clip=None, dp_delta=1e-5)  # no noise on uploads (params.yaml's)
    fedcache = SimpleNamespace(beta=1.5, T=3.0, consistency=consistency, cold_start="skip", encode_up="float32",
                               encode_down="float32")
    fedavg = SimpleNamespace(eval_model="personalized", encode_up="float32", encode_down="float32")
    return SimpleNamespace(seed=seed, train=train, fedcache=fedcache, fedavg=fedavg)


def load_data(synthetic: bool) -> ImageDataset:
    """FashionMNIST (data/raw or the Debian package), or random images of its shape and size."""
    if not synthetic:
        try:
            return load_dataset("fashion_mnist", ROOT / "data" / "raw")
        except Exception as err:  # noqa: BLE001 - said, then the synthetic stand-in
            print(f"FashionMNIST not found ({type(err).__name__}); using synthetic data of its shape", flush=True)
    gen = np.random.default_rng(0)
    return ImageDataset(name="synthetic", train_x=gen.integers(0, 256, (60000, 28, 28), dtype=np.uint8),
                        train_y=gen.integers(0, 10, 60000).astype(np.int64),
                        test_x=gen.integers(0, 256, (10000, 28, 28), dtype=np.uint8),
                        test_y=gen.integers(0, 10, 10000).astype(np.int64),
                        classes=tuple(str(c) for c in range(10)), source="synthetic")


def relations_by_label(images: np.ndarray, labels: np.ndarray, R: int, dim: int = 128) -> np.ndarray:
    """[N, R] ids of each sample's R most similar same-label samples (cosine of a random projection)."""
    gen = torch.Generator().manual_seed(0)
    flat = torch.from_numpy(images.reshape(len(images), -1)).float()
    codes = torch.nn.functional.normalize(flat @ torch.randn(flat.shape[1], dim, generator=gen), dim=1)
    out = np.zeros((len(labels), R), dtype=np.int64)
    for c in np.unique(labels):
        ids = torch.from_numpy(np.flatnonzero(labels == c))
        z = codes[ids]
        for start in range(0, len(ids), 2048):
            sim = z[start:start + 2048] @ z.T
            rows = torch.arange(start, min(start + 2048, len(ids)))
            sim[rows - start, rows] = -2.0  # never a sample's own neighbour
            out[ids[rows].numpy()] = ids[sim.topk(R, dim=1).indices].numpy()
    return out


class HarnessFedCache(FedCache):
    """The library's FedCache with relations given in memory and no SQL store."""

    relations: np.ndarray

    def load_relations(self) -> np.ndarray:
        return self.relations

    def open_store(self):
        return None


def partition_and_clients(setting: str | dict, device: str, synthetic: bool, seed: int, params) -> tuple:
    """The setting's Dirichlet partition, its dataset and the library's clients over it."""
    s = _setting(setting)
    ds = load_data(synthetic)
    part_params = SimpleNamespace(scheme="dirichlet", num_clients=s["num_clients"], alpha=1.0, classes_per_client=2,
                                  samples_per_client=s.get("samples_per_client"), data_fraction=None, min_samples=10,
                                  max_retries=100, test_fraction=s.get("test_fraction", 1.0), val_ratio=1.0,
                                  # a setting may train on every sample, like the official code (no validation split)
                                  val_holdout=s.get("val_holdout", 0.1))
    part = make_partition(ds.train_y, ds.test_y, ds.num_classes, part_params, seed)
    dev = torch.device(device)
    clients = build_clients(params, part, ds, dev, s["hetero"])
    ctx = ServerContext(params, part.num_clients, ds.num_classes, ds.input_shape, part, dev, Path("/tmp"), s["hetero"])
    return ds, part, clients, ctx


def simulation(method_cls: type[Server], setting: str | dict, params, device: str, synthetic: bool, seed: int = 0
               ) -> tuple[Simulation, Partition]:
    """The library's Simulation of a method over the setting (sequential executor: set `.executor` to change it)."""
    ds, part, clients, ctx = partition_and_clients(setting, device, synthetic, seed, params)
    if method_cls is HarnessFedCache:
        HarnessFedCache.relations = relations_by_label(ds.train_x[part.train_index], part.train_labels, 16)
    return Simulation(method_cls, clients, ctx, SequentialExecutor()), part


def build(setting: str | dict, consistency: str, device: str, group_size: int, synthetic: bool, seed: int = 0,
          precision: str = "float32") -> tuple[Simulation, Partition]:
    """FedCache over the setting."""
    params = bench_params(_setting(setting)["model"], consistency, group_size, seed, precision)
    return simulation(HarnessFedCache, setting, params, device, synthetic, seed)


def timed_rounds(sim: Simulation, rounds: int, device: str, timers: list[Timer] | None = None) -> list[float]:
    """Seconds of each round (downloads, local training, uploads, aggregation; no evaluation); each round's
    Timer (its "exchange": the server half and the ledger) is appended to `timers` when given."""
    out = []
    selected = list(range(len(sim.clients)))
    for r in range(1, rounds + 1):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        timer = Timer()
        start = time.perf_counter()
        sim.run_round(r, selected, timer)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
        if timers is not None:
            timers.append(timer)
    return out


def mean_accuracy(sim: Simulation) -> float:
    rows, _ = sim.evaluate(0)
    return float(np.mean([a for _, a, _ in rows]))
