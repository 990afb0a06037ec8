"""Proves that tests rewritten for issue 36 catch the defect they were written for: each entry plants one defect
(an old bug put back, or a plausible one) in a throw-away copy of the repository and checks that its test fails.

    .venv/bin/python bench/planted_defects.py                      # every entry (tens of minutes on 2 cores)
    .venv/bin/python bench/planted_defects.py mtfl-final-download  # the named entries only
    .venv/bin/python bench/planted_defects.py --list               # the entries
    .venv/bin/python bench/planted_defects.py --write docs/planted-defects.md

For each entry: `git worktree add --detach` of HEAD in a temporary folder; its test run there as is (the
control: it must pass); the edit applied there (refused unless its old text occurs exactly once); the test
run again (it must fail on an assertion); the worktree removed. The tests run as `.venv/bin/python -m pytest`
with the worktree as the working directory, so its `pipeline` package is the one imported (python -m puts the
working directory first on sys.path; checked once per run), never this checkout's, which is left untouched.
Prints a markdown table; exits non-zero when a control fails or a planted defect is not caught by an assertion.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv" / "bin" / "python"


class Entry(NamedTuple):
    name: str
    test: str  # pytest node id
    path: str  # file to edit, relative to the repository
    old: str  # exact text, found exactly once
    new: str
    defect: str  # what the planted bug is (the old bug, or a plausible one)


ENGINE, ASYNC = "pipeline/train/engine.py", "pipeline/train/schedules/async_.py"
AC = "tests/test_async_cache.py::"

ENTRIES = [
    Entry("fedcache-restamp",
          "tests/test_fedcache_parts.py::test_a_fedcache_run_records_the_cache_stats_each_round",
          "pipeline/methods/fedcache/knowledge.py",
          "        self.updated_in[ids] = round_\n", "        self.updated_in[:] = round_\n",
          "every cache write restamps every sample with the current round (staleness flat at 0)"),
    Entry("peers-weighted-mean", "tests/test_peers.py::test_heterogeneous_models_train[local]", ENGINE,
          "        mean_acc = float(np.mean(tested)) if tested else None\n",
          "        mean_acc = float(np.average(tested, weights=[n for *_, n in rows if n])) if tested else None\n",
          "the round's accuracy is the mean over clients weighted by test-split size, not the plain mean"),
    Entry("feddkc-no-t2",
          "tests/test_gkt.py::test_feddkc_client_loss_is_ce_plus_beta_t2_kl_toward_the_downloaded_server_logits",
          "pipeline/methods/feddkc/method.py",
          '        return kd_rows(logits, step.t["teacher"], self.params.feddkc.temperature)\n',
          '        return kd_rows(logits, step.t["teacher"], self.params.feddkc.temperature) '
          '/ self.params.feddkc.temperature ** 2\n',
          "FedDKC's client KD term without the T^2 factor"),
    Entry("pdfl-calibrated-diagnostic",
          "tests/test_pdfl.py::test_attention_weights_and_teacher_diagnostics_are_round_metrics",
          "pipeline/methods/pdfl/method.py",
          '            diag["internal_teacher_acc"] = accuracy(mixed, y)\n',
          '            diag["internal_teacher_acc"] = accuracy(calibrate(mixed, y), y)\n',
          "pDFL's internal_teacher_acc measured after calibration (its argmax is then always the label)"),
    Entry("pdfl-external-calibrated",
          "tests/test_pdfl.py::test_the_body_phase_teacher_is_the_mean_of_the_delivered_feedback_copies",
          "pipeline/methods/pdfl/method.py",
          '                targets["external"] = calibrate(t_ext, y) if p.external_calibrate else t_ext\n',
          '                targets["external"] = calibrate(t_ext, y)\n',
          "pDFL's external (feedback) teacher calibrated although pdfl.external_calibrate is off"),
    Entry("fedproto-farthest",
          "tests/test_fedproto.py::test_bytes_equal_payload_sizes_and_both_readings_recorded[plain-homo]",
          "pipeline/methods/fedproto/method.py",
          "            pred = classes[torch.cdist(z, protos.to(z.dtype)).argmin(dim=1)]\n",
          "            pred = classes[torch.cdist(z, protos.to(z.dtype)).argmax(dim=1)]\n",
          "FedProto's prototype reading takes the farthest global prototype instead of the nearest"),
    Entry("async-cache-write-at-training",
          AC + "test_async_fedcache_reads_the_cache_at_a_clients_start_and_writes_it_at_its_arrival", ASYNC,
          "        u.upload = upload\n        self._push(arrival, ARRIVED, k)\n",
          "        u.upload = upload\n        self.sim.server.arrive(r, k, upload)\n"
          "        self._push(arrival, ARRIVED, k)\n",
          "async: an upload is written into the cache when it is trained (and again at its arrival), so starts "
          "before its arrival read it"),
    Entry("async-cache-stamped-by-update",
          AC + "test_async_cache_staleness_counts_spans_since_each_neighbours_upload_arrived", ASYNC,
          "            self.sim.server.arrive(r, k, u.upload)\n",
          "            self.sim.server.arrive(u.number, k, u.upload)\n",
          "async: an arrival is stamped with the update's number instead of the span it arrives in (staleness "
          "counted in the client's updates, not in spans)"),
    Entry("async-ledger-dropped-upload",
          AC + "test_the_ledger_counts_what_completed_when_devices_drop_out_mid_update", ASYNC,
          "the update is dropped then\n            self._push(offline, DROPPED, k)\n            return\n"
          "        u.upload = upload\n",
          "the update is dropped then\n            self.sim.receive(r, k, upload, at=offline)\n"
          "            self._push(offline, DROPPED, k)\n            return\n        u.upload = upload\n",
          "async: an upload cut short by the connection dropping is counted when the connection drops"),
    Entry("async-ledger-cut-download",
          AC + "test_the_ledger_counts_what_completed_when_devices_drop_out_mid_update", ASYNC,
          "nor is trained on\n            u.download = []\n",
          "nor is trained on\n            self.sim.deliver(r, k, u.download)\n"
          "            u.download = []\n",
          "async: a download cut short by the connection dropping is counted"),
    Entry("mtfl-final-download",
          "tests/test_mtfl.py::test_the_download_the_last_evaluation_reads_is_counted_in_the_last_round[before_local]",
          ENGINE, "        if round_ == self.last_round:\n            self.final_downloads(round_)\n", "",
          "old bug (before 0b6e54e): MTFL's download of the new shared layers after the last round, which the "
          "last evaluation reads, is not counted"),
    Entry("clock-cut-download",
          "tests/test_clock.py::test_a_client_whose_connection_drops_mid_download_neither_receives_it_nor_trains",
          ENGINE, "        received = selected if clock is None else clock.receivers(start, down_bytes)\n",
          "        received = selected\n",
          "old bug (before a6fd804): a client whose connection drops mid-download is counted as receiving it "
          "and trains on it"),
    Entry("async-drop-future-instant",
          "tests/test_async.py::test_a_drop_is_logged_at_the_instant_the_connection_drops_in_the_span_it_falls_in",
          ASYNC, "the update is dropped then\n            self._push(offline, DROPPED, k)\n",
          "the update is dropped then\n            self._log(r, max(offline, t), k, DROPPED)\n"
          "            self._push(max(offline, t), START, k)\n",
          "old bug (before 34fb1e4): a drop during the upload is logged when the training ends, in that span, "
          "with the later instant the connection drops"),
    Entry("pdfl-copies-untimed", "tests/test_clock.py::test_pdfl_times_the_peer_copies_its_clients_train", ENGINE,
          "                k, self.samples_trained(self.clients[k], round_)\n"
          "                + self.local.extra_samples(self.clients[k], uploads[k], round_), down_bytes[k],\n",
          "                k, self.samples_trained(self.clients[k], round_), down_bytes[k],\n",
          "old bug (before 534120b): the peer copies a pDFL client trains take no simulated time"),
    Entry("server-compute-untimed",
          "tests/test_clock.py::test_the_servers_compute_takes_its_time_after_the_last_upload[fedavg]", ENGINE,
          "        work = server.take_work()  # the server's compute of the round: timed after its last upload\n"
          "        if clock is not None:\n            clock.serve(work)\n", "",
          "old bug (before 08f94e2): the server's compute takes no simulated time"),
    Entry("val-split-ignored", "tests/test_training.py::test_the_validation_split_is_evaluated_on_its_own_samples",
          "pipeline/federation/clients.py", "        c.x_test, c.y_test = c.x_val, c.y_val\n", "        pass\n",
          "clients.on_split does nothing: the validation reading is the test split again"),
]


def run_test(tree: Path, test: str) -> tuple[bool, str, str]:
    """(passed, first failure line, full output) of one node id run in `tree`."""
    # no stale .pyc between the control and the edit; wide lines: the summary keeps the exception type
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "1000"}
    out = subprocess.run([str(PYTHON), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                          f"--basetemp={tree.parent / 'pytest'}", test],
                         cwd=tree, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    passed = out.returncode == 0 and re.search(r"\b1 passed\b", text) is not None
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    first = next((e for e in errors if e.startswith("assert")), errors[0] if errors else "")
    return passed, f"E   {first}" if first else "", text


class Worktree:
    """`git worktree add --detach <tmp> HEAD`, removed (`git worktree remove --force`) on exit."""

    def __enter__(self) -> Path:
        self.tmp = Path(tempfile.mkdtemp(prefix="planted-"))
        self.tree = self.tmp / "repo"
        subprocess.run(["git", "worktree", "add", "--detach", str(self.tree), "HEAD"], cwd=ROOT, check=True,
                       capture_output=True)
        return self.tree

    def __exit__(self, *exc) -> None:
        subprocess.run(["git", "worktree", "remove", "--force", str(self.tree)], cwd=ROOT, check=True,
                       capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def plant(tree: Path, e: Entry) -> None:
    path = tree / e.path
    text = path.read_text()
    if text.count(e.old) != 1:
        raise SystemExit(f"{e.name}: the old text occurs {text.count(e.old)} times in {e.path}, not once:\n{e.old}")
    path.write_text(text.replace(e.old, e.new))


def check_import(tree: Path) -> str:
    """The worktree's own pipeline package is what `python -m` imports there (not this checkout's)."""
    where = subprocess.run([str(PYTHON), "-c", "import pipeline; print(pipeline.__file__)"], cwd=tree,
                           capture_output=True, text=True, check=True).stdout.strip()
    print(f"in the worktree, pipeline is {where}", file=sys.stderr)
    if not Path(where).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the worktree imports {where}, not its own pipeline package")
    return where


def cell(text: str, code: bool = False) -> str:
    text = text.replace("|", "\\|")
    return f"`{text.replace('`', chr(39))}`" if code and text else text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="entries to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the entries and exit")
    ap.add_argument("--no-control", action="store_true", help="skip the control run of each test without the edit")
    ap.add_argument("--write", metavar="PATH", help="also write the table to PATH, headed by the command, date, commit")
    args = ap.parse_args()
    by_name = {e.name: e for e in ENTRIES}
    if args.list:
        for e in ENTRIES:
            print(f"{e.name}: {e.test}\n    {e.defect}")
        return 0
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        ap.error(f"unknown entries {unknown}; --list shows them")
    chosen = [by_name[n] for n in args.names] if args.names else ENTRIES
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    started = datetime.now(timezone.utc)
    controlled: dict[str, bool] = {}
    rows, bad = [], []
    for i, e in enumerate(chosen):
        with Worktree() as tree:
            if i == 0:
                imported = check_import(tree)
            t0 = time.monotonic()
            if not args.no_control and e.test not in controlled:
                ok, first, text = run_test(tree, e.test)
                controlled[e.test] = ok
                if not ok:
                    print(text[-4000:], file=sys.stderr)
            control = {None: "not run", True: "passed", False: "FAILED"}[controlled.get(e.test)]
            if controlled.get(e.test) is False:
                result, first = "not run: the test fails without the edit", ""
            else:
                plant(tree, e)
                passed, first, text = run_test(tree, e.test)
                summary = re.search(rf"^FAILED {re.escape(e.test)} - (\w+)", text, re.M)
                assertion = summary is not None and summary.group(1) in ("assert", "AssertionError")
                if passed:
                    result = "PASSED: NOT CAUGHT"
                elif assertion:
                    result = "failed, as it should"
                else:
                    result = "FAILED, but not on an assertion"
                    print(text[-4000:], file=sys.stderr)
            if not result.startswith("failed"):
                bad.append(e.name)
            print(f"{e.name}: {result} ({time.monotonic() - t0:.0f} s) {first}", file=sys.stderr, flush=True)
            rows.append(f"| {e.name} | {cell(e.test, True)} | {cell(e.defect)} | {control} | {result} "
                        f"| {cell(first[:200], True)} |")
    table = "\n".join(["| entry | test | planted defect | without the edit | with it | first failure line |",
                       "|---|---|---|---|---|---|", *rows])
    print(table)
    if bad:
        print(f"\nNOT PROVEN: {', '.join(bad)}", file=sys.stderr)
    if args.write:
        command = " ".join([".venv/bin/python", "bench/planted_defects.py", *sys.argv[1:]])
        Path(args.write).write_text(
            f"# Planted defects\n\nBack to [the tests](testing.md).\n\nGenerated by `{command}` on "
            f"{started:%Y-%m-%d %H:%M} UTC at commit {commit}: each row runs its test in a throw-away worktree of "
            f"that commit, {'' if args.no_control else 'first as it is, then '}with one defect planted, and says "
            "whether the test failed on an assertion (bench/planted_defects.py says how). There, `import pipeline` "
            f"read {imported}, not this checkout's.\n\n" + table + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
