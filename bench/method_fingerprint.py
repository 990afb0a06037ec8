"""Did a refactor of the training core move any method's results? A fingerprint of every method, in-process.

    .venv/bin/python bench/method_fingerprint.py OUT.json [--compare OLD.json [--new-kinds KIND,...]]

Runs every registered method (homogeneous, and heterogeneous where it allows it) on both the
sequential and the vectorized executor, 3 rounds on the test suite's tiny MNIST setting (3 clients,
60 samples each, one thread, float32, two of three clients a round so partial participation is
exercised), and writes per run: every round's ledger rows, per-client accuracies and extra metrics, and a
SHA-256 of every client's final weights. Then every method again (homogeneous) on simulated devices
that go offline and come back (so drops happen) under each schedule, sync, deadline and async, with the round
and ledger instants; a combination the params or the method refuse is recorded as "refused". With --compare, prints which runs
differ from OLD.json, and in what (weights, accuracies, extras, bytes, instants), and exits 1 when any does;
--new-kinds leaves out the ledger rows of payload kinds a change added on purpose before comparing. Same machine and threads: the figures are bit-exact.
Takes about 3 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


class Recorder:
    """Stands in for the per-run results file: keeps what the engine writes each round."""

    def __init__(self) -> None:
        self.rounds: list = []

    def start_run(self, *args, **kwargs) -> None:
        pass

    def resume_problem(self, run_id: str) -> str:
        return "never resumed here"

    def write_round(self, run_id, round_, mean_acc, up, down, seconds, rows, ledger_rows, extras=None,
                    sim_time_s=None) -> None:
        # a ledger row's simulated instant (7th field) and the round's are kept only with the clock on, so
        # fingerprints from before the clock existed still compare
        ledger = [list(r[:6]) if len(r) == 7 and r[6] is None else list(r) for r in ledger_rows]
        entry = {"round": round_, "mean_acc": mean_acc, "up": up, "down": down,
                 "clients": [list(r) for r in rows], "extras": extras, "ledger": ledger}
        if sim_time_s is not None:
            entry["sim_time_s"] = sim_time_s
        self.rounds.append(entry)

    def finish_run(self, run_id: str, status: str = "finished") -> None:
        pass


def weights_digest(trainer) -> str:
    h = hashlib.sha256()
    for client in trainer.clients:
        for name, tensor in client.model.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


# devices that drop out: online about 3 s at a time, offline about 1 s (the tiny setting's rounds take seconds)
DEVICES = {"enabled": True, "samples_per_s": 100.0, "samples_per_s_sigma": 0.7, "online_mean_s": 3.0,
           "offline_mean_s": 1.0}
SCHEDULES = {
    "sync": {"train": {"schedule": "sync"}},
    "deadline": {"train": {"schedule": "deadline", "deadline_quantile": 0.67}},
    "async": {"train": {"schedule": "async", "participation": 1.0, "async_eval_s": 2.0}},
}


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(base.get(k, {}), v) if isinstance(v, dict) else v
    return out


def fingerprint_all() -> dict:
    import os

    from conftest import make_workspace, with_section
    from pipeline import paths
    from pipeline.data.datasets import load_dataset
    from pipeline.methods import registry
    from pipeline.train.engine import Trainer

    mnist = load_dataset("mnist", ROOT / "data" / "raw")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        _, params, part = make_workspace(Path(tmp), mnist, {
            "partition": {"num_clients": 3, "samples_per_client": 60, "min_samples": 5},
            "train": {"rounds": 3, "threads": 1, "participation": 0.67}})
        for name in registry.names():
            cls = registry.params_class(name)
            method_params = with_section(params, name, **cls.tiny_setting) if cls.tiny_setting else params
            for hetero in (False,) if cls.supports.heterogeneous is not True else (False, True):
                for executor in ("sequential", "vectorized"):
                    run = f"{name}-{'hetero' if hetero else 'homo'}-{executor}"
                    recorder = Recorder()
                    trainer = Trainer(with_section(method_params, "train", executor=executor),
                                      registry.method_class(name), part, mnist, paths.RUNS / run,
                                      paths.CHECKPOINTS / f"{run}.pt", recorder, [paths.PARTITION], hetero)
                    trainer.run()
                    out[run] = {"rounds": recorder.rounds, "weights": weights_digest(trainer)}
                    print(f"{run}: done", flush=True)
        for name in registry.names():
            out.update(_schedule_runs(name, params, part, mnist))
    return out


def _schedule_runs(name: str, params, part, mnist) -> dict:
    """The method under each schedule on devices that drop out (homogeneous; the tiny setting's executor, which
    async replaces by the sequential one)."""
    from conftest import with_section
    from pipeline import paths
    from pipeline.config import parse_params
    from pipeline.errors import ConfigError
    from pipeline.methods import registry
    from pipeline.train.engine import Trainer

    cls = registry.params_class(name)
    out = {}
    for schedule, over in SCHEDULES.items():
        run = f"{name}-homo-{schedule}-devices"
        raw = _merged(params.model_dump(mode="json", by_alias=True),
                      {"devices": DEVICES, **over})
        # the method alone in train.algorithms: params load refuses a schedule any listed method has no form for
        raw["train"] = {**raw["train"], "algorithms": [name], "hetero_algorithms": []}
        if schedule != "sync":  # deadline and async refuse FedCache's per-step exchange (and params naming fedcache)
            raw = _merged(raw, {"fedcache": {"consistency": "round"}})
        try:
            run_params = parse_params(raw)
            if cls.tiny_setting:
                run_params = with_section(run_params, name, **cls.tiny_setting)
            recorder = Recorder()
            trainer = Trainer(run_params, registry.method_class(name), part, mnist, paths.RUNS / run,
                              paths.CHECKPOINTS / f"{run}.pt", recorder, [paths.PARTITION], False)
        except (ConfigError, ValueError) as e:  # pydantic's ValidationError is a ValueError
            out[run] = {"refused": True}
            print(f"{run}: refused ({str(e).splitlines()[0][:100]})", flush=True)
            continue
        trainer.run()
        out[run] = {"rounds": recorder.rounds, "weights": weights_digest(trainer)}
        print(f"{run}: done", flush=True)
    return out


def without_kinds(run: dict, kinds: set[str]) -> dict:
    """The run as it would read without the ledger rows of `kinds` (and their bytes in the round totals)."""
    if not kinds or "rounds" not in run:
        return run
    rounds = []
    for entry in run["rounds"]:
        dropped = [row for row in entry["ledger"] if row[3] in kinds]
        entry = {**entry, "ledger": [row for row in entry["ledger"] if row[3] not in kinds]}
        for direction in ("up", "down"):
            entry[direction] -= sum(row[4] for row in dropped if row[2] == direction)
        rounds.append(entry)
    return {**run, "rounds": rounds}


def differences(old: dict, new: dict) -> list[str]:
    """Which parts of a run differ: final weights, per-client accuracies, extra metrics, bytes, simulated instants."""
    if old.get("refused") or new.get("refused") or "rounds" not in old or "rounds" not in new:
        return [] if old == new else ["refused" if old.get("refused") != new.get("refused") else "missing"]
    parts = {"weights": old["weights"] != new["weights"]}
    a, b = old["rounds"], new["rounds"]
    if len(a) != len(b):
        return [*[p for p, d in parts.items() if d], "rounds"]
    pick = {"accuracies": lambda e: (e["round"], e["mean_acc"], e["clients"]), "extras": lambda e: e["extras"],
            "bytes": lambda e: (e["up"], e["down"], [row[:6] for row in e["ledger"]]),
            "instants": lambda e: (e.get("sim_time_s"), [row[6:] for row in e["ledger"]])}
    for part, key in pick.items():
        parts[part] = [key(e) for e in a] != [key(e) for e in b]
    return [p for p, d in parts.items() if d]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--compare", type=Path, help="an earlier fingerprint to compare with")
    ap.add_argument("--new-kinds", default="", help="comma-separated payload kinds a change added on purpose: "
                    "their ledger rows (and bytes) are left out of the new fingerprint before comparing")
    args = ap.parse_args()
    out = fingerprint_all()
    args.out.write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.compare is None:
        return 0
    old = json.loads(args.compare.read_text())
    out = json.loads(args.out.read_text())  # NaN readings compare equal only as the same parsed constant
    new_kinds = {k for k in args.new_kinds.split(",") if k}
    differ = 0
    for run in sorted(set(old) | set(out)):
        parts = differences(old.get(run, {}), without_kinds(out.get(run, {}), new_kinds))
        print(f"{run:32s} {'same' if not parts else 'DIFFERS: ' + ', '.join(parts)}")
        differ += bool(parts)
    print(f"{len(out)} runs, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
