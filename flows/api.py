"""The Prefect API a stage reports to: one server per `dvc repro`, which never outlives its owner.

Prefect's own ephemeral server is a plain child process of the stage: a stage killed with SIGKILL
(what the OOM killer does) leaves it running, port held, and every stage pays its start (10-15 s on
2 cores). Here, when PREFECT_API_URL is unset, a stage uses the server of its *owner*: the `dvc`
process that runs it when there is one (so the stages of one `dvc repro` or one experiment share a
server), else the stage itself. The server watches its owner and exits within a fraction of a
second once the owner is gone, however it went.

    start_early()                                 # a stage started as `python -m flows.<stage>`, before its imports
    ensure_api()                                  # in a stage, before its flow runs: waits until the server answers
    .venv/bin/python -m flows.api --owner PID     # the server itself (started by either)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

# No import of the flows package here: it is imported before this module whenever this module is (its parent; its
# PREFECT_HOME and offline defaults set), and flows/__init__.py imports this module, for start_early().
ROOT = Path(__file__).resolve().parent.parent

POLL_S = 0.2  # how often a server looks for its owner
DVC_PROGRAMS = {"dvc"}


# ---------------------------------------------------------------- processes, from /proc (Linux)

def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (which may hold spaces), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process
    (a pid alone may be reused after the process ends)."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None  # field 22 of stat; the first two are before ")"


def alive(pid: int, started: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == started


def _parent(pid: int) -> int:
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def _is_dvc(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    names = [os.path.basename(a.decode(errors="replace")) for a in argv[:2]]
    return bool(set(names) & DVC_PROGRAMS)  # `dvc ...`, or its interpreter running it: `python .venv/bin/dvc ...`


def owner_pid() -> int:
    """The nearest `dvc` process above this one, or this process when there is none."""
    pid = _parent(os.getpid())
    while pid > 1:
        if _is_dvc(pid):
            return pid
        pid = _parent(pid)
    return os.getpid()


# ---------------------------------------------------------------- the client side

def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _registry() -> Path:
    return Path(os.environ["PREFECT_HOME"]) / "stage-servers"


def _owner_record() -> tuple[int, int, Path]:
    """(owner pid, its start time, the file naming its server)."""
    owner = owner_pid()
    started = start_time(owner)
    registry = _registry()
    registry.mkdir(parents=True, exist_ok=True)
    return owner, started, registry / f"{owner}-{started}.json"


def _lock():
    from filelock import FileLock

    return FileLock(str(_registry() / ".lock"))  # two stages of one owner never start two servers


def start_early() -> None:
    """Start the owner's server without waiting for it to answer (nothing when PREFECT_API_URL is set or the server
    is up or starting already): a stage calls this before its imports (flows/__init__.py), so that the server's start
    (seconds: Prefect's server imports) runs beside the stage's own (torch, Prefect), and ensure_api() later waits
    only for what is left of it."""
    if os.environ.get("PREFECT_API_URL"):
        return
    owner, started, record = _owner_record()
    with _lock():
        if _server(record) is None:
            _spawn(owner, started, record)


def ensure_api(timeout_s: float | None = None) -> str | None:
    """Point this process's Prefect at its owner's server, starting it if needed, and wait until it answers; returns
    its API URL (None when PREFECT_API_URL is set already: that server is used as it is)."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    timeout_s = timeout_s or float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 180))
    owner, started, record = _owner_record()
    with _lock():
        server = _server(record) or _spawn(owner, started, record)
        _wait(server, record, timeout_s)
    url = server["url"]
    os.environ["PREFECT_API_URL"] = url
    _apply(url)
    return url


def _apply(url: str) -> None:
    """Prefect read its settings when it was imported: read them again, now with the URL."""
    import prefect.context

    prefect.context.refresh_global_settings_context()


def _server(record: Path) -> dict | None:
    """The owner's server named by `record` when it is running (answering, or still starting); None when there is no
    record or its server is gone (killed: a record the server could not remove)."""
    try:
        server = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    running = _healthy(server["url"]) or ("pid_start" in server and alive(server["pid"], server["pid_start"]))
    return server if running else None


def _spawn(owner: int, started: int, record: Path) -> dict:
    """Start the owner's server on a free port and name it in `record` at once (it removes the record when it
    stops); the server answers seconds later (_wait)."""
    port = _free_port()
    log = record.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flows.api", "--owner", str(owner), "--owner-start", str(started),
                                 "--port", str(port), "--record", str(record)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # Ctrl-C reaches the owner, which it follows
    server = {"url": f"http://127.0.0.1:{port}/api", "pid": proc.pid, "pid_start": start_time(proc.pid), "owner": owner}
    record.write_text(json.dumps(server))
    return server


def _wait(server: dict, record: Path, timeout_s: float) -> None:
    """Until the server answers; a server that exits or does not answer in time is an error naming its log (its
    record removed, so that the next stage starts a fresh one)."""
    log = record.with_suffix(".log")
    deadline = time.monotonic() + timeout_s
    while not _healthy(server["url"]):
        if not alive(server["pid"], server.get("pid_start") or 0):
            record.unlink(missing_ok=True)
            raise RuntimeError(f"the Prefect API server exited before it answered; its log: {log}\n"
                               f"{log.read_text()[-2000:] if log.is_file() else ''}")
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(server["pid"], signal.SIGKILL)
            record.unlink(missing_ok=True)
            raise RuntimeError(f"the Prefect API server did not answer within {timeout_s:.0f} s "
                               f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); its log: {log}")
        time.sleep(0.1)


# ---------------------------------------------------------------- the server side

def create_app():
    """Prefect's API without its UI or background services, as its own ephemeral server runs it."""
    from prefect.server.api.server import create_app as prefect_app

    return prefect_app(ephemeral=True, final=True)


# Read by Prefect when it is imported. A stage's server registers no block types in the database at its start: the
# stages use no Prefect blocks, and the check alone (hashing every block class) was half a second of each start.
# `make server` (the UI's server) registers them as usual.
STAGE_SERVER_SETTINGS = {"PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
                         "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}


def serve(owner: int, owner_start: int, port: int, record: Path | None) -> int:
    os.environ.update(STAGE_SERVER_SETTINGS)
    import prefect.server.api.server  # noqa: F401  (what create_app needs: most of the server's start)
    import uvicorn

    from flows import imports_done

    imports_done()  # flows/__init__.py paused the collector for the imports of `python -m flows.api`
    os.environ["PREFECT_UI_ENABLED"] = "0"
    server = uvicorn.Server(uvicorn.Config(create_app, factory=True, host="127.0.0.1", port=port, log_level="error",
                                           lifespan="on"))

    def follow_owner() -> None:
        while alive(owner, owner_start):
            time.sleep(POLL_S)
        server.should_exit = True
        time.sleep(10)  # a graceful stop that hangs is cut short
        os._exit(0)

    threading.Thread(target=follow_owner, daemon=True).start()
    try:
        server.run()
    finally:
        if record is not None:
            record.unlink(missing_ok=True)
        gc.freeze()  # the interpreter's shutdown collections skip the server's heap (as a stage's: flows/cli.py)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A Prefect API server that exits when its owner process does.")
    parser.add_argument("--owner", type=int, required=True, help="the pid it follows")
    parser.add_argument("--owner-start", type=int, help="the owner's start time (/proc/PID/stat), against pid reuse")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, help="the file naming this server, removed when it stops")
    args = parser.parse_args(argv)
    owner_start = args.owner_start if args.owner_start is not None else start_time(args.owner)
    if owner_start is None:
        return 0  # the owner is gone already
    return serve(args.owner, owner_start, args.port, args.record)


if __name__ == "__main__":
    sys.exit(main())
