"""The dask executor (`train.executor: dask`): each selected client's local update is a Prefect
task on a Dask cluster, run through prefect-dask's DaskTaskRunner.

Where things live:
  - the server half (the Server: configure, aggregate), the clients' evaluation, the byte ledger,
    the results file and the checkpoint stay in the flow's process; a worker gets only the client half (the
    method's `LocalUpdate`, which holds the params), one client and its download;
  - client state travels with each task and back: the client (model, optimizer, `state`, its
    training data; not its test split) goes to whichever worker is free, and the trained
    model's and optimizer's state dicts and `state` come back and are loaded into the flow's
    client in place. The workers keep nothing between rounds, so any worker can take any
    client (largest clients are submitted first, which balances uneven clients) and a lost
    worker loses no state. README "Clients on a Dask cluster" has the measured cost of this.

The cluster: `train.dask_address` joins a running scheduler; otherwise a local cluster of
`train.dask_workers` worker processes (default: one per core), 1 thread each, is started on
first use and stopped by `close()` (the Trainer's), also when a round fails; a finalizer stops
it at exit if nobody closed it. Workers run torch with 1 thread and the flow process's default
dtype. The task runs report to the flow's Prefect API (the ephemeral server a flow run starts,
or PREFECT_API_URL), so they show up as children of the round in the Prefect UI.

A client half that calls the per-step exchange hook (FedCache `live`) cannot run on a worker:
`pipeline.train.engine.make_executor` runs such a method on the sequential executor and says so;
FedCache `step` is refused by the params check (it needs the vectorized executor).

Imported only when `train.executor` is dask: the training core imports with torch and numpy alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlparse

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from pipeline.federation.contract import LocalUpdate, Upload
from pipeline.federation.clients import Client
from pipeline.federation.ledger import Payload
from pipeline.errors import ConfigError
from pipeline.train.executors import SequentialExecutor, StepHook, evaluate
from pipeline.progress import BarFactory, no_bar

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class ClientResult:
    """What a worker sends back for one client: its upload and its trained state."""

    upload: Upload
    model: dict[str, torch.Tensor]
    optimizer: dict
    state: dict[str, torch.Tensor]
    seconds: float  # the local update's compute time on the worker
    worker: str  # the worker's address


@task(cache_policy=NO_CACHE, persist_result=False, task_run_name="round-{round_}-client-{client_id}")
def local_update(local: LocalUpdate, client: Client, download: list[Payload], round_: int, client_id: int,
                 dtype: torch.dtype) -> ClientResult:
    """One client's local update on a Dask worker (no server half here: no per-step exchange)."""
    torch.set_num_threads(1)
    _roomy_malloc()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        start = time.perf_counter()
        upload = SequentialExecutor.run_client(local, client, download, round_)
        seconds = time.perf_counter() - start
    finally:
        torch.set_default_dtype(previous)
    return ClientResult(upload, client.model.state_dict(), client.optimizer.state_dict(), dict(client.state), seconds,
                        _worker_address())


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def _roomy_malloc() -> None:
    """Undo what Dask's nanny does to glibc malloc in its workers, for torch's sake.

    The nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to give memory back to the OS);
    setting it also freezes glibc's mmap threshold at 128 KiB, so every activation or gradient
    tensor above that is mmap'd and unmapped again at each step: measured, a ResNet-8 step at
    batch 8 took twice as long on a worker as in a plain process. These are the values glibc's
    own dynamic thresholds grow to (32 MiB mmap, twice that trim). Safe to repeat; a no-op off glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
    libc.mallopt(M_TRIM_THRESHOLD, 64 * 2**20)


def _warm_worker() -> int:
    """Run once on every worker at start: imports the training core (a worker that cannot, e.g. one
    started outside the project's environment, fails here with its error rather than mid-round)."""
    import pipeline.federation.contract  # noqa: F401
    import pipeline.train.dask_executor  # noqa: F401

    torch.set_num_threads(1)
    _roomy_malloc()
    return os.getpid()


@contextmanager
def _outside_enclosing_task():
    """Submit as if no task run were running here: Prefect serializes the current task run's context,
    parameters included, into every submitted task, and flows/train.py's round task has the Trainer
    (results file, ledger, every client) as its parameter. The flow run's context still goes along."""
    from prefect.context import TaskRunContext

    token = TaskRunContext.__var__.set(None)
    try:
        yield
    finally:
        TaskRunContext.__var__.reset(token)


def _nbytes(obj) -> int:
    """Bytes of the tensors in (nested dicts/lists of) obj: what a task carries, roughly."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    if isinstance(obj, Payload):
        return obj.nbytes
    if isinstance(obj, torch.nn.Module):
        return _nbytes(obj.state_dict())
    if isinstance(obj, torch.optim.Optimizer):
        return _nbytes(obj.state_dict()["state"])
    return 0


def _shipped(client: Client) -> Client:
    """The client as it travels: everything local training needs; not its test split."""
    return dataclasses.replace(client, x_test=client.x_test[:0], y_test=client.y_test[:0])


class DaskExecutor:
    name = "dask"
    # torch threads of the flow's process, which runs the server half and the evaluation while
    # the workers (1 thread each) wait, and waits while they train
    threads = os.cpu_count() or 1
    bars: BarFactory = staticmethod(no_bar)  # a bar over the round's clients (the engine's caller sets one)

    def __init__(self, address: str | None = None, workers: int | None = None):
        self.address = address
        self.workers = workers or (os.cpu_count() or 1)
        self._runner = None
        self._finalizer = None
        self._api_url: str | None = None
        self.last_round: dict = {}  # per client: compute seconds, worker, bytes each way; the round's wall time
        self._seconds: dict[int, float] = {}  # each client's last local update on a worker

    def _cost(self, client: Client) -> float:
        """A client's expected local-update time: its last one, else its samples x its model's depth (at batch 8
        a step costs about one unit per layer: ResNet-8/16/20 steps take about 1 : 1.8 : 2.5)."""
        if client.id in self._seconds:
            return self._seconds[client.id]
        layers = sum(isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)) for m in client.model.modules())
        return client.num_train * max(layers, 1) * 5e-4  # about half a millisecond per sample and layer

    # -- the cluster ---------------------------------------------------------------------

    def start(self) -> None:
        """Start (or join) the cluster and warm its workers; idempotent. Called on first use."""
        if self._runner is not None:
            return
        from prefect_dask import DaskTaskRunner

        for name in ("distributed", "prefect_dask"):  # their INFO lines would bury the stage's own output
            logging.getLogger(name).setLevel(logging.WARNING)
        if self.address:
            runner = DaskTaskRunner(address=self.address)
        else:
            self._api_url = self._prefect_api()  # the local workers are told it as they start
            env = {"PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # a Trainer run outside a flow (tests, bench)
                   **({"PREFECT_API_URL": self._api_url} if self._api_url else {})}
            runner = DaskTaskRunner(cluster_kwargs=dict(n_workers=self.workers, threads_per_worker=1, processes=True,
                                                        dashboard_address=":0", env=env))
        runner.__enter__()
        self._runner = runner
        self._finalizer = weakref.finalize(self, runner.__exit__, None, None, None)
        try:
            import dask

            # no MALLOC_TRIM_THRESHOLD_ for the local workers (see _roomy_malloc), and quiet logs
            with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                                  "logging.distributed": "warning"}):
                try:
                    client = runner.client  # creates the local cluster, or connects to the scheduler
                except OSError as err:
                    if not self.address:
                        raise
                    raise ConfigError(f"train.dask_address: no Dask scheduler answers at {self.address} ({err}); start "
                                      "one (`dask scheduler`), or set train.dask_address: null for a local cluster") \
                        from None
            client.wait_for_workers(1, timeout=120)
            if self.address:  # only once the scheduler answered: an unreachable one fails before a server starts
                self._api_url = self._prefect_api()
            try:
                pids = client.run(_warm_worker)
            except ImportError as err:
                raise RuntimeError(f"a Dask worker cannot import this project ({err}): start `dask worker` with the "
                                   "project's .venv (README: Clients on a Dask cluster)") from err
        except BaseException:
            self.close()
            raise
        where = f"scheduler {self.address}" if self.address else "a local cluster"
        print(f"dask executor: {len(pids)} workers on {where} (dashboard {client.dashboard_link})", flush=True)

    def _prefect_api(self) -> str | None:
        """The Prefect API the workers' task runs report to: PREFECT_API_URL when set, else the
        ephemeral server of this process (started by the flow run; started here outside one),
        unless the workers are on other machines, where 127.0.0.1 is not this one."""
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            return PREFECT_API_URL.value()
        if self.address and urlparse(self.address).hostname not in LOOPBACK:
            print("dask executor: PREFECT_API_URL is not set, so each worker records its task runs in a Prefect "
                  "server of its own; set it to a server every machine reaches to see them in one place", flush=True)
            return None
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as api:
            return str(api.api_url)

    def close(self) -> None:
        """Stop the local cluster (or leave the remote one); safe to call twice."""
        runner, self._runner = self._runner, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if runner is not None:
            runner.__exit__(None, None, None)

    def _submit(self, parameters: dict):
        """DaskTaskRunner.submit without Dask's content hashing: it names a task by tokenizing its arguments
        (a pickle of the client, data included, for nothing: each task runs once): 0.24 s per client,
        measured on a busy 2-core machine."""
        from prefect_dask.task_runners import PrefectDaskFuture

        future = self._runner.client.submit(local_update, parameters=parameters, return_type="state", pure=False)
        return PrefectDaskFuture(wrapped_future=future, task_run_id=future.task_run_id)

    # -- a round -------------------------------------------------------------------------

    def run(self, local: LocalUpdate, clients: list[Client], downloads: dict[int, list[Payload]], round_: int,
            hook: StepHook) -> dict[int, Upload]:
        if local.uses_exchange:  # make_executor never builds this executor for such a method
            raise RuntimeError(f"{type(local).__name__}: the per-step exchange hook cannot run on Dask workers")
        self.start()
        from prefect.settings import PREFECT_API_URL, temporary_settings

        start = time.perf_counter()
        selected = [c.id for c in clients]
        clients = {c.id: c for c in clients}
        # longest first (submission order is the order workers take them): the workers end together
        order = sorted(selected, key=lambda k: -self._cost(clients[k]))
        dtype = torch.get_default_dtype()
        settings = {PREFECT_API_URL: self._api_url} if self._api_url else {}
        futures, sent = {}, {}
        try:
            # the task runs' context carries the API they report to, and the flow run's; not the enclosing
            # task run's (flows/train.py's round task), whose parameters hold the whole Trainer
            with temporary_settings(settings), _outside_enclosing_task():
                for k in order:
                    shipped = _shipped(clients[k])
                    sent[k] = _nbytes([shipped.x_train, shipped.y_train, shipped.ids, shipped.model, shipped.optimizer,
                                       shipped.state, downloads[k]])
                    futures[k] = self._submit({"local": local, "client": shipped, "download": downloads[k],
                                               "round_": round_, "client_id": k, "dtype": dtype})
            results: dict[int, ClientResult] = {}
            with self.bars(len(order), "client") as progress:
                for k in order:
                    results[k] = futures[k].result()
                    progress.update(1)
        except BaseException:
            for f in futures.values():
                f.wrapped_future.cancel()
            raise
        stats = {}
        for k in order:
            c, r = clients[k], results[k]
            c.model.load_state_dict(r.model)
            c.optimizer.load_state_dict(r.optimizer)
            c.state = dict(r.state)
            stats[k] = {"seconds": r.seconds, "worker": r.worker, "bytes_to": sent[k],
                        "bytes_back": _nbytes([r.model, r.optimizer["state"], r.state, r.upload.payloads])}
            self._seconds[k] = r.seconds
        self.last_round = {"wall_s": time.perf_counter() - start, "clients": stats}
        return {k: results[k].upload for k in selected}

    evaluate = staticmethod(evaluate)  # in the flow's process, where the clients' test splits are
