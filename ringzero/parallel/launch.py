"""Starting ranks: a pool of local gloo processes (checks, tests, benchmarks) and torchrun's environment.

``RankPool(n)`` starts ``n`` processes once (forked from a clean forkserver), joins them into one gloo
job over loopback and then runs any number of jobs on them: ``pool.run(fn, *args)`` calls
``fn(ctx, *args)`` on every rank and returns the per-rank results. ``fn`` must be importable (module
level). Process groups for a ``ParallelDims`` are built once per pool and handed out through
``ctx.groups(dims)``. A job that fails or stops answering tears the pool down, since its ranks may be
stuck in a collective.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ringzero.errors import RingzeroError
from ringzero.model.vector_math import set_threads
from ringzero.parallel.dims import ParallelDims, ParallelGroups, build_groups


@dataclass
class RankContext:
    rank: int
    world_size: int
    _groups: dict = field(default_factory=dict)

    def groups(self, dims: ParallelDims) -> ParallelGroups:
        if dims not in self._groups:
            self._groups[dims] = build_groups(dims)
        return self._groups[dims]


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _worker(rank: int, world_size: int, port: int, threads: int, jobs, results, owner_pid: int) -> None:
    # Loopback only: gloo otherwise picks the interface of the host name, which may not route.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    set_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    ctx = RankContext(rank, world_size)
    while True:
        try:
            job = jobs.get(timeout=5.0)
        except queue.Empty:
            if _owner_alive(owner_pid):
                continue
            break  # the process that owns the pool is gone (killed, crashed): nobody will send a job
        if job is None:
            break
        fn, args, kwargs = job
        try:
            results.put((rank, True, fn(ctx, *args, **kwargs)))
        except BaseException:  # noqa: BLE001 - the traceback travels to the parent
            results.put((rank, False, traceback.format_exc()))
    # Flush our answers, then leave without interpreter teardown: destroying the gloo group and
    # unloading torch take seconds per rank and nothing is left to clean up.
    results.close()
    results.join_thread()
    os._exit(0)


class RankPool:
    """``n`` local gloo ranks kept alive across jobs."""

    def __init__(self, world_size: int, threads: int = 1, timeout_s: float = 300.0, grace_s: float = 10.0):
        if world_size < 1:
            raise RingzeroError(f"a rank pool needs at least one rank (got {world_size})")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.grace_s = grace_s  # how long the other ranks may take to report once one has failed
        # forkserver: one clean, single-threaded server imports torch once and forks the ranks from
        # it, instead of every rank importing torch again (spawn) or inheriting our threads (fork).
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["ringzero.parallel.launch"])
        # The parent hosts the rendezvous store on a free port the OS picks, so no port can collide.
        self._store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False)
        self._results = ctx.Queue()
        self._jobs = [ctx.Queue() for _ in range(world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, world_size, self._store.port, threads, self._jobs[r], self._results, os.getpid()),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def run(self, fn, *args, **kwargs) -> list:
        if not self.alive:
            raise RingzeroError("rank pool is not running (a previous job failed or it was closed)")
        for q in self._jobs:
            q.put((fn, args, kwargs))
        out: list = [None] * self.world_size
        errors = []
        pending = self.world_size
        deadline = time.monotonic() + self.timeout_s
        failed_at = 0.0
        while pending:
            try:
                rank, ok, value = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive()]
                # Once a rank has failed, the others get a short grace period to report, then the
                # pool is torn down: they are probably blocked in a collective the failed rank left.
                if dead or time.monotonic() > (
                    deadline if not errors else min(deadline, failed_at + self.grace_s)
                ):
                    codes = {r: self._procs[r].exitcode for r in dead}
                    self.close(force=True)
                    why = "\n".join(errors) or (
                        f"ranks {list(codes)} exited with codes {list(codes.values())}"
                        if codes
                        else f"no answer within {self.timeout_s:.0f} s"
                    )
                    raise RingzeroError(f"rank job {getattr(fn, '__name__', fn)} failed:\n{why}") from None
                continue
            pending -= 1
            if ok:
                out[rank] = value
            else:
                errors.append(f"[rank {rank}] {value}")
                failed_at = time.monotonic()
        if errors:
            self.close(force=True)  # the other ranks may be waiting in a collective that never completes
            raise RingzeroError(f"rank job {getattr(fn, '__name__', fn)} failed:\n" + "\n".join(errors))
        return out

    def close(self, force: bool = False) -> None:
        if not self._procs:
            return
        if not force:
            for q in self._jobs:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        self._procs = []

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)


def run_ranks(world_size: int, fn, *args, threads: int = 1, **kwargs) -> list:
    """Spawn ``world_size`` ranks for a single job."""
    with RankPool(world_size, threads=threads) as pool:
        return pool.run(fn, *args, **kwargs)


def init_from_env() -> None:
    """Join the job torchrun describes in the environment: NCCL when a GPU is visible, gloo otherwise."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
