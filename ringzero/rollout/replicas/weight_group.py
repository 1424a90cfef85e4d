"""The trainer's end of SGLang's weight-update group: rank 0 of a process group shared with every server.

SGLang's servers join with ``init_custom_process_group`` (``python/sglang/srt/utils``): a ``tcp://``
rendezvous at ``master_address:master_port``, a ``PrefixStore`` named after the group, then torch's
``_new_process_group_helper``, which nests the keys under ``"{group_name}/"`` and ``"{device}/"`` and
builds the backend (one for all devices when a single backend serves them all, as gloo serves cpu and
cuda; keyed by the first device). The trainer builds
the same backends on the same store keys directly instead of calling that helper: in a trainer started
by torchrun the default group is bound to a GPU, and the helper would then make the new NCCL
communicator a split of the trainer's own communicator, which the servers are not part of.

The group is used for one thing: ``broadcast`` of every tensor from rank 0, in the order of the names
the servers were given.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch.distributed.distributed_c10d import (
    Backend,
    BackendConfig,
    BroadcastOptions,
    PrefixStore,
    rendezvous,
)

from ringzero.errors import RingzeroError
from ringzero.rollout.replicas.endpoints import url_host


def init_group_body(
    master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
) -> dict:
    """``InitWeightsUpdateGroupReqInput``: the server's TP ranks join as ``rank_offset + tp_rank``."""
    return {
        "master_address": master_address,
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": group_name,
        "backend": backend,
    }


def distributed_update_body(
    names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str, weight_version: str
) -> dict:
    """``UpdateWeightsFromDistributedReqInput``: the server receives the tensors in ``names`` order from rank
    0."""
    return {
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [list(s) for s in shapes],
        "group_name": group_name,
        "weight_version": str(weight_version),
        "flush_cache": True,
        "abort_all_requests": False,
    }


@dataclass
class WeightGroup:
    """Rank 0's backends of the group, one per device type (``cpu``, ``cuda``)."""

    name: str
    backend: str
    world_size: int
    backends: dict
    store: object  # the TCP store the group meets at; kept alive as long as the group

    def broadcast(self, tensors: Sequence[torch.Tensor]) -> list:
        """Start one broadcast per tensor from rank 0, in order; returns the pending works."""
        works = []
        for t in tensors:
            device = t.device.type
            if device not in self.backends:
                raise RingzeroError(
                    f"weight group {self.name!r} ({self.backend}) cannot send a {device} tensor"
                )
            opts = BroadcastOptions()
            opts.rootRank, opts.rootTensor = 0, 0
            works.append(self.backends[device].broadcast([t], opts))
        return works


def open_group(
    master_address: str, master_port: int, world_size: int, group_name: str, backend: str, timeout_s: float
) -> WeightGroup:
    """Rank 0 of the group: serve its store and wait until every other rank joined (``timeout_s``)."""
    timeout = timedelta(seconds=timeout_s)
    url = f"tcp://{url_host(master_address)}:{master_port}"
    store, rank, size = next(rendezvous(url, 0, world_size, timeout=timeout))
    store.set_timeout(timeout)
    group_store = PrefixStore(f"{group_name}/", PrefixStore(group_name, store))
    by_device = BackendConfig(Backend(backend)).get_device_backend_map()
    backends = {}
    for device, name in by_device.items():
        made = _backend(name, PrefixStore(f"{device}/", group_store), rank, size, group_name, timeout)
        made._set_sequence_number_for_group()
        if len(set(by_device.values())) == 1:
            # As torch's helper does: one backend serves every device (gloo: cpu and cuda), keyed by the
            # first.
            backends = dict.fromkeys(by_device, made)
            break
        backends[device] = made
    return WeightGroup(group_name, backend, world_size, backends, store)


def _backend(name: str, store, rank: int, size: int, group_name: str, timeout: timedelta):
    if name == Backend.GLOO:
        from torch.distributed import ProcessGroupGloo

        pg = ProcessGroupGloo(store, rank, size, timeout=timeout)
        pg.options.global_ranks_in_group = []
        pg.options.group_name = group_name
        return pg
    if name == Backend.NCCL:
        try:
            from torch.distributed import ProcessGroupNCCL
        except ImportError:
            raise RingzeroError("weight group backend nccl: this torch build has no NCCL") from None
        opts = ProcessGroupNCCL.Options()
        opts.is_high_priority_stream = False
        opts._timeout = timeout
        opts.global_ranks_in_group = []
        opts.group_name = group_name
        return ProcessGroupNCCL(store, rank, size, opts)
    raise RingzeroError(f"weight group backend {name!r} is not supported (nccl or gloo)")


def rank_offsets(replicas: int, tp_size: int) -> list[int]:
    """The trainer is rank 0; replica ``r``'s TP ranks start at ``1 + r * tp_size``."""
    return [1 + r * tp_size for r in range(replicas)]


def own_address() -> str:
    """The address other pods reach this one at: its host name's address (a pod's IP in Kubernetes)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise RingzeroError(
            f"cannot resolve this host's address ({exc}); set engines.rollout.distributed.master_address"
        ) from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
