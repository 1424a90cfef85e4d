"""The job a stage runs in: its device, this process's rank, and the parallel groups of ``dp x cp``.

One ``Runtime`` per process, built once by the command that starts the work (``from_env``) and passed
explicitly to every stage; nothing here is global state. A single process is a job of one rank: the
collectives below are then no-ops, so stage code has one path for every layout.

Ranks are started by torchrun (``ringzero run --nproc N`` starts it for you; a cluster job runs it
itself), which describes the job in ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT``. The backend follows the device: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist

from ringzero.errors import RingzeroError
from ringzero.parallel.config import world_product
from ringzero.parallel.dims import ParallelDims, ParallelGroups, build_groups

DeviceSetting = Literal["auto", "cpu", "cuda"]
COLLECTIVE_TIMEOUT = timedelta(minutes=30)
"""How long a collective may wait for a slow rank; a dead rank ends the job sooner (torchrun stops the
rest)."""


def resolve_device(setting: DeviceSetting, local_rank: int = 0) -> torch.device:
    """``auto``: this rank's GPU when CUDA is present, else the CPU; ``cuda`` without a GPU is refused."""
    if setting not in ("auto", "cpu", "cuda"):
        raise RingzeroError(f"run.device must be auto, cpu or cuda (got {setting!r})")
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RingzeroError("run.device is cuda but no CUDA device is visible to this process")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RingzeroError(f"LOCAL_RANK {local_rank} has no GPU: this host shows {count}")
    return torch.device("cuda", local_rank)


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dims: ParallelDims
    rank: int = 0
    local_rank: int = 0
    groups: ParallelGroups | None = field(default=None, compare=False)

    @property
    def world_size(self) -> int:
        return self.dims.world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def dp_rank(self) -> int:
        return self.dims.coords(self.rank)[0]

    @property
    def cp_rank(self) -> int:
        return self.dims.coords(self.rank)[1]

    # -- collectives (no-ops on one rank) ----------------------------------------------------------

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` in place over the ranks that each fill their own entries of it. Every rank when
        tp = 1; the ranks of a TP group fill the same entries alike, so the sum runs over this TP index's
        ranks only (the ``values`` group). Under pipeline parallelism only the last stage computes
        per-token values and the other stages hold zeros there: the sum gives every stage the values."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.groups.values if self.groups else None)
        return tensor

    def dp_slice(self, n: int) -> slice:
        """This data-parallel replica's contiguous share of ``n`` rows (shares differ by at most one)."""
        d, dp = self.dp_rank, self.dims.dp
        return slice(d * n // dp, (d + 1) * n // dp)

    def world_slice(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items over all ranks (rollout requests)."""
        r, w = self.rank, self.world_size
        return slice(r * n // w, (r + 1) * n // w)


def single(device: str | torch.device = "cpu") -> Runtime:
    """A job of one process (what tests and the plain CLI use)."""
    return Runtime(device=torch.device(device), dims=ParallelDims(dp=1, cp=1, world_size=1))


def from_env(
    parallel,
    device: DeviceSetting = "auto",
    env: dict[str, str] | None = None,
    tp: int = 1,
    ep: int = 1,
    pp: int = 1,
) -> Runtime:
    """The runtime torchrun's environment describes, with ``parallel`` (a ``ParallelConfig``) and the
    training engine's ``tp`` and ``pp`` (and ``ep``, carved out of the dp ranks) checked against its world
    size. Joins the default process group once when there is more than one rank."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    rank, local_rank = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    names, values, need = world_product(parallel.dp, parallel.cp, tp, pp)
    if need != world:
        raise RingzeroError(
            f"{names} = {values} = {need} ranks, but the job has WORLD_SIZE={world}: start it with --nproc "
            f"{need} "
            f"or set the degrees so that their product is {world}"
        )
    dims = ParallelDims.from_config(parallel, world, tp, ep, pp)
    dev = resolve_device(device, local_rank)
    if world == 1:
        return Runtime(device=dev, dims=dims)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if dev.type == "cuda" else "gloo",
            timeout=COLLECTIVE_TIMEOUT,
            **({"device_id": dev} if dev.type == "cuda" else {}),
        )
    return Runtime(device=dev, dims=dims, rank=rank, local_rank=local_rank, groups=build_groups(dims))


def shutdown(runtime: Runtime) -> None:
    if runtime.distributed and dist.is_initialized():
        dist.destroy_process_group()
