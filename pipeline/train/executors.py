"""How the selected clients' local updates run (`train.executor`).

Both executors run the same client half (a method's `LocalUpdate`) and give each client the
same batches in the same order (seeded by round, client and pass), so they compute the same
thing; they differ only in how the arithmetic is batched.

  sequential   one client after another, each with its own nn.Module and torch SGD: the
               reference, and the only executor for FedCache's `live` consistency.
  vectorized   clients that share an architecture train together: one grouped network
               (models/grouped.py) takes one batched step for all of them, each client
               keeping its own weights, BatchNorm statistics, momentum, data order and batch
               size. Uneven client sizes and partial batches are handled with masks; clients
               are sorted by their number of steps so the ones still training are a prefix.
  dask         each selected client's `run_client` as a Prefect task on a Dask cluster
               (pipeline/train/dask_executor.py, imported only when asked for).

An executor gets the client half, the clients and the per-step hook, never the server half. The
per-step hook (FedCache `live` / `step`) is a `StepHook` the engine supplies: its `exchange`
records the step's payloads in the ledger and asks the server half, its `end_step` tells the
server half that every client took the step.

Evaluation is a client task too (`LocalUpdate.evaluate`), run one client after another by every
executor (dask in the flow's process, where the test splits are): batched across clients in grouped
networks, as the vectorized executor did before, it measured slower on every CPU kind and precision
tried (bench/eval_speed.py, docs/executors.md).

Every executor runs a step's forward + loss and every evaluation in `train.precision`
(pipeline/train/precision.py: bfloat16 autocast or plain float32); what leaves a step is float32.
"""

from __future__ import annotations

import os
from collections import defaultdict
from functools import partial
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from pipeline.federation.contract import Evaluation, LocalUpdate, Phase, Step, Upload
from pipeline.federation.clients import Client, phase_batches
from pipeline.federation.ledger import Payload
from pipeline.progress import BarFactory, no_bar
from pipeline.train.lanes import each_alone, lockstep, serialized
from pipeline.train.precision import as_float32, autocast_for, autocast_off

# The vectorized executor's training steps run the grouped network's activations in NHWC (channels_last);
# evaluation (each client's own model) runs in NCHW: the same arithmetic in another summation order. Measured side
# by side on 2-core CPUs (bench/levers.py, docs/executors.md): NHWC trained faster on both CPU kinds and evaluated
# slower on both.
TRAIN_CHANNELS_LAST = True

Exchange = Callable[[int, dict[int, Payload]], dict[int, Payload]]
Records = dict[str, tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class StepHook:
    """The server half's per-step hook as an executor sees it (the engine wraps it to count bytes)."""

    exchange: Exchange
    end_step: Callable[[], None]


def evaluate(local: LocalUpdate, clients: list[Client], download: list[Payload]) -> dict[int, Evaluation]:
    """Every client's evaluation (a client task), one client after another, in the run's precision."""
    out = {}
    for c in clients:
        with autocast_for(local.params, c.x_test.device):
            out[c.id] = local.evaluate(c, download)
    return out


@contextmanager
def trainable_only(model: torch.nn.Module, trainable: Callable[[str], bool] | None):
    """Freeze the parameters a phase does not train (no grad: SGD leaves them and their momentum alone)."""
    frozen = [p for n, p in model.named_parameters() if trainable is not None and not trainable(n)]
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _stack_records(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([i for i, _ in parts]), torch.cat([r for _, r in parts])


class SequentialExecutor:
    name = "sequential"
    threads = 1  # default torch threads: at batch 8 a second thread slows one small model down
    bars: BarFactory = staticmethod(no_bar)  # a bar over the round's clients (the engine's caller sets one)

    def run(self, local: LocalUpdate, clients: list[Client], downloads: dict[int, list[Payload]], round_: int,
            hook: StepHook) -> dict[int, Upload]:
        uploads = {}
        with self.bars(len(clients), "client") as progress:
            for client in clients:
                uploads[client.id] = self.run_client(local, client, downloads[client.id], round_, hook.exchange,
                                                     hook.end_step)
                progress.update(1)
        return uploads

    evaluate = staticmethod(evaluate)

    @staticmethod
    def run_client(local: LocalUpdate, client: Client, download: list[Payload], round_: int,
                   exchange: Exchange | None = None, end_step: Callable[[], None] | None = None) -> Upload:
        """One client's local update: the client half alone, so a Dask worker can run it without the
        server half (a method's per-step `exchange` hook and `end_step` are then absent: it must not use them)."""
        targets = local.begin(client, download, round_)
        records: dict[str, list] = defaultdict(list)
        for phase in local.phases(round_):
            client.model.train()
            with trainable_only(client.model, phase.trainable):
                for idx in phase_batches(client, round_, local.params, phase.stream, phase.repeat):
                    dev = idx.to(client.x_train.device)
                    ids = client.ids[idx]

                    def send(payload: Payload, ids=ids) -> dict[str, torch.Tensor]:
                        if exchange is None:
                            raise RuntimeError("this client half calls the per-step exchange hook, which runs only "
                                               "next to the server half (sequential or vectorized executor)")
                        with autocast_off(client.x_train.device):
                            down = exchange(round_, {client.id: _to_cpu(payload)})[client.id]
                        return {n: a.to(client.x_train.device) for n, a in down.arrays.items()}

                    step = Step(x=client.x_train[dev], y=client.y_train[dev], ids=ids,
                                t={n: v[dev] for n, v in targets.items()}, exchange=send,
                                record=lambda name, rows, idx=idx: records[name].append(
                                    (idx, as_float32(rows.detach()))))
                    # forward + loss in the run's precision; backward and the optimizer step outside it
                    with autocast_for(local.params, client.x_train.device):
                        rows = local.loss(client.model, step, phase)
                    client.step(rows.sum() / len(idx))
                    if end_step is not None:
                        end_step()
        return local.end(client, targets, {n: _stack_records(p) for n, p in records.items()}, round_)


def _to_cpu(payload: Payload) -> Payload:
    """A per-step payload as it leaves the client: on the CPU, floats as float32 whatever the precision."""
    return Payload(payload.kind, {n: as_float32(a.detach().cpu()) for n, a in payload.arrays.items()}, payload.sender)


# -- vectorized ---------------------------------------------------------------------------


def architecture(model: torch.nn.Module) -> tuple:
    """Clients whose models have this same signature can share one grouped network."""
    return (type(model).__name__, tuple((n, tuple(p.shape)) for n, p in model.named_parameters()))


def step_cost(model: torch.nn.Module) -> int:
    """One client's step's work, for balancing lanes (pipeline/train/lanes.py): its parameter count, about in
    proportion to its FLOPs for models of one family."""
    return sum(p.numel() for p in model.parameters())


class GroupRun:
    """One group of same-architecture clients training together for one round."""

    def __init__(self, clients: list[Client], targets: list[dict[str, torch.Tensor]], local: LocalUpdate,
                 round_: int, exchange: Exchange):
        from models.grouped import GroupedModel, GroupedSGD

        t = local.params.train
        self.local, self.round, self.exchange = local, round_, exchange
        # longest first: at every step the clients still training are a prefix of the group
        order = sorted(range(len(clients)), key=lambda i: -clients[i].num_train)
        self.clients = [clients[i] for i in order]
        self.targets = [targets[i] for i in order]
        self.model = GroupedModel([c.model for c in self.clients], channels_last=TRAIN_CHANNELS_LAST)
        self._client_cost = step_cost(self.clients[0].model)
        self.model.load_from([c.model for c in self.clients], [c.optimizer for c in self.clients])
        self.opt = GroupedSGD(self.model, t.lr, t.momentum, t.weight_decay)
        # every client's samples in one table, plus one padding row at the end
        sizes = [c.num_train for c in self.clients]
        self.offsets = torch.tensor([0] + sizes).cumsum(0)
        self.pad = int(self.offsets[-1])
        self.x = _with_pad_row([c.x_train for c in self.clients])
        self.y = _with_pad_row([c.y_train for c in self.clients])
        self.ids = torch.cat([torch.cat([c.ids for c in self.clients]), torch.tensor([-1])])
        self.t = {n: _with_pad_row([tg[n] for tg in self.targets]) for n in (self.targets[0] if self.targets else {})}
        self.records: dict[str, list] = defaultdict(list)

    def plan(self, phase: Phase) -> int:
        """Lay out the phase's batches: index [G, S, B] into the sample table, sizes [G, S]; returns S."""
        self.phase = phase
        self.model.train()
        batch = self.local.params.train.batch_size
        per_client = [phase_batches(c, self.round, self.local.params, phase.stream, phase.repeat) for c in self.clients]
        S = max(len(b) for b in per_client)
        self.index = torch.full((len(self.clients), S, batch), self.pad, dtype=torch.long)
        self.sizes = torch.zeros(len(self.clients), S, dtype=torch.long)
        for g, batches in enumerate(per_client):
            for s, idx in enumerate(batches):
                self.index[g, s, :len(idx)] = idx + self.offsets[g]
                self.sizes[g, s] = len(idx)
        self.num_steps = torch.tensor([len(b) for b in per_client])
        return S

    def active(self, s: int) -> int:
        """How many clients take step s (they are the first ones)."""
        return int((self.num_steps > s).sum())

    def cost(self) -> int:
        """One client's step's work (step_cost)."""
        return self._client_cost

    def step(self, s: int) -> None:
        A = self.active(s)
        if A == 0:
            return
        sizes = self.sizes[:A, s]
        B = int(sizes.max())
        flat = self.index[:A, s, :B].reshape(-1)
        dev_flat = flat.to(self.x.device)
        full = bool((sizes == B).all())
        mask = None if full else (torch.arange(B).unsqueeze(0) < sizes.unsqueeze(1))
        self.model.set_step(A, B, None if mask is None else mask.to(self.x.device))
        step = Step(x=self.x[dev_flat], y=self.y[dev_flat], ids=self.ids[flat],
                    t={n: v[dev_flat] for n, v in self.t.items()},
                    exchange=lambda payload: self._exchange(payload, A, B, sizes),
                    record=lambda name, rows: self.records[name].append((flat, as_float32(rows.detach()))))
        # forward + loss in the run's precision; backward and the optimizer step outside it
        with autocast_for(self.local.params, self.x.device):
            rows = self.local.loss(self.model, step, self.phase).view(A, B)
        if mask is not None:
            rows = rows * mask.to(rows.device, rows.dtype)
        per_client = rows.sum(dim=1) / sizes.to(rows.device, rows.dtype)
        per_client.sum().backward()
        self.opt.step(A, self.phase.trainable)
        # the gradients go as soon as they are used: in lockstep every group waits for the others' steps, and its
        # gradients, as large as its weights, would wait with it
        self.opt.zero_grad()

    def _exchange(self, payload: Payload, A: int, B: int, sizes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a step's per-row payload by client, run the hook, lay the answers out as rows again."""
        ups = {}
        for a in range(A):
            n = int(sizes[a])
            ups[self.clients[a].id] = Payload(payload.kind, {name: as_float32(arr[a * B:a * B + n].detach().cpu())
                                                             for name, arr in payload.arrays.items()})
        with autocast_off(self.x.device):
            downs = self.exchange(self.round, ups)
        out = {}
        for name in downs[self.clients[0].id].arrays:
            first = downs[self.clients[0].id].arrays[name]
            pad = float("nan") if first.is_floating_point() else 0  # encoded answers may be integer codes
            rows = torch.full((A * B, *first.shape[1:]), pad, dtype=first.dtype)
            for a in range(A):
                rows[a * B:a * B + int(sizes[a])] = downs[self.clients[a].id].arrays[name]
            out[name] = rows.to(self.x.device)
        return out

    def finish(self) -> dict[int, tuple[Client, dict, Records]]:
        """Copy the trained weights, statistics and momentum back into each client; its targets and records."""
        self.model.write_back([c.model for c in self.clients], [c.optimizer for c in self.clients])
        per_client: dict[int, Records] = {c.id: {} for c in self.clients}
        for name, parts in self.records.items():
            flat, rows = _stack_records(parts)
            real = flat != self.pad
            flat, rows = flat[real], rows[real.to(rows.device)]
            owner = torch.bucketize(flat, self.offsets[1:], right=True)  # which client each visited row belongs to
            order = torch.sort(owner, stable=True).indices  # group by client, visit order kept
            flat, owner, rows = flat[order], owner[order], rows[order.to(rows.device)]
            counts = torch.bincount(owner, minlength=len(self.clients)).tolist()
            for g, (f, r) in enumerate(zip(flat.split(counts), rows.split(counts))):
                per_client[self.clients[g].id][name] = (f - self.offsets[g], r)
        return {c.id: (c, tg, per_client[c.id]) for c, tg in zip(self.clients, self.targets)}


def _with_pad_row(parts: list[torch.Tensor]) -> torch.Tensor:
    table = torch.cat(parts)
    return torch.cat([table, torch.zeros_like(table[:1])])


class VectorizedExecutor:
    name = "vectorized"
    threads = os.cpu_count() or 1  # default torch threads: a grouped step is big enough to use every core

    bars: BarFactory = staticmethod(no_bar)  # a bar over the round's clients (the engine's caller sets one)

    def __init__(self, group_size: int, side_by_side: bool = True):
        self.group_size = group_size
        self.side_by_side = side_by_side  # train.side_by_side: lockstep groups in lanes (pipeline/train/lanes.py)

    def groups(self, clients: list[Client]) -> list[list[Client]]:
        """Clients by architecture, similar sizes together (fewer idle slots), chunked to group_size."""
        by_arch: dict[tuple, list[Client]] = defaultdict(list)
        for c in clients:
            by_arch[architecture(c.model)].append(c)
        out = []
        for members in by_arch.values():
            members = sorted(members, key=lambda c: -c.num_train)
            out += [members[i:i + self.group_size] for i in range(0, len(members), self.group_size)]
        return out

    def lanes(self, groups: list[list[Client]], uses_exchange: bool) -> int:
        """How many groups train side by side (train.side_by_side; pipeline/train/lanes.py): as many as torch
        threads, on the CPU only (on a GPU the groups share one device: unmeasured). A per-step exchange steps
        every group in lockstep, in lanes. Without one, each group trains its round alone, and side by side only
        where the groups differ in architecture: measured faster there (bench/official_round.py's `round` row,
        bench/scaling.py's hetero cells) and slower for chunks of one architecture (its homo K = 100 cell)."""
        if not (self.side_by_side and groups and groups[0][0].x_train.device.type == "cpu"):
            return 1
        if not uses_exchange and len({architecture(g[0].model) for g in groups}) == 1:
            return 1
        return min(len(groups), torch.get_num_threads())

    def run(self, local: LocalUpdate, clients: list[Client], downloads: dict[int, list[Payload]], round_: int,
            hook: StepHook) -> dict[int, Upload]:
        from models.grouped import supports

        selected = [c.id for c in clients]
        exchange = hook.exchange
        # a model the grouped network cannot express (a custom architecture) trains on its own
        alone = {c.id for c in clients if supports(c.model) is not None}
        finished_alone = {c.id: SequentialExecutor.run_client(local, c, downloads[c.id], round_, exchange,
                                                              hook.end_step)
                          for c in clients if c.id in alone}
        clients = [c for c in clients if c.id not in alone]
        targets = {c.id: local.begin(c, downloads[c.id], round_) for c in clients}
        groups = self.groups(clients)
        finished: dict[int, tuple] = {}
        lanes = self.lanes(groups, local.uses_exchange)
        shared = serialized(exchange) if lanes > 1 else exchange
        end_step = serialized(hook.end_step) if lanes > 1 else hook.end_step
        with self.bars(len(clients), "client") as progress:  # a group's clients are done when its last step is
            if local.uses_exchange:
                # a per-step exchange must see every group's step s before any group's step s+1: lockstep
                runs = [GroupRun(g, [targets[c.id] for c in g], local, round_, shared) for g in groups]
                for phase in local.phases(round_):
                    steps = max(run.plan(phase) for run in runs)
                    with lockstep(lanes) as step:
                        for s in range(steps):
                            step(runs, s)
                            end_step()
                for run in runs:
                    finished.update(run.finish())
                    progress.update(len(run.clients))
            else:
                # each group trains its whole round alone, `lanes` groups at a time: at most that many grouped
                # networks alive
                def round_of(group: list[Client]) -> dict:
                    run = GroupRun(group, [targets[c.id] for c in group], local, round_, shared)
                    for phase in local.phases(round_):
                        for s in range(run.plan(phase)):
                            run.step(s)
                            end_step()
                    return run.finish()

                cost = [sum(c.num_train for c in g) * step_cost(g[0].model) for g in groups]
                for done in each_alone([partial(round_of, g) for g in groups], cost, lanes):
                    finished.update(done)
                    progress.update(len(done))
        ended = local.end_all([finished[k] for k in selected if k not in alone], round_)
        return {k: finished_alone[k] if k in alone else ended[k] for k in selected}

    evaluate = staticmethod(evaluate)  # one client after another (the module's docstring says why)
