"""``DistributedReplicaSet``: a ``ReplicaSet`` whose weight pushes broadcast tensors from the trainer's rank 0
to every replica over a torch.distributed group (SGLang's ``/init_weights_update_group`` and
``/update_weights_from_distributed``; see ``replica_set`` for the protocol and ``weight_group`` for the
trainer's end of the group).

A group lives as long as its members: when a member is lost or a replica returns, the next push (or the
catch-up of the returning replica) leaves the old group and opens a new one, ``group_name-N`` on a new
port, with exactly the live replicas; the last tensors are kept until the next push so that a returning
replica can be sent them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
import torch

from ringzero.errors import RingzeroError
from ringzero.rollout.replicas.fan_out import Pool, named, results, wait_all
from ringzero.rollout.replicas.push_phases import OneBroadcast, push_phases
from ringzero.rollout.replicas.replica_set import ReplicaSet
from ringzero.rollout.replicas.weight_group import (
    WeightGroup,
    distributed_update_body,
    free_port,
    init_group_body,
    open_group,
    own_address,
    rank_offsets,
)
from ringzero.rollout.types import ServerClient

log = structlog.get_logger(__name__)


class DistributedReplicaSet(ReplicaSet):
    """A ``ReplicaSet`` whose ``update_weights`` broadcasts tensors to every replica over a torch.distributed
    group."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tp_size: int = 1,
        backend: str = "nccl",
        master_address: str | None = None,
        master_port: int = 0,
        group_name: str = "ringzero-weights",
        sync_timeout_s: float = 600.0,
        dtype: torch.dtype | None = None,
        **kwargs,
    ):
        super().__init__(endpoints, **kwargs)
        self.dtype = dtype  # the rollout body dtype: half the bytes of fp32 masters under a bf16 body
        self.tp_size, self.backend, self.group_name = tp_size, backend, group_name
        self.master_address, self.master_port, self.sync_timeout_s = (
            master_address,
            master_port,
            sync_timeout_s,
        )
        self.group: WeightGroup | None = None
        self.broken: str | None = None  # why the group cannot be used any more (the next push reopens it)
        self.members: list[str] = []  # the replicas in the group, in rank order
        self.generation = 0  # groups opened so far: the first keeps group_name, later ones add -N
        self._last_sent: tuple[dict, str] | None = None

    def update_weights(self, state_dict: dict[str, torch.Tensor], weight_version: str) -> None:
        """Send a ``HybridLM`` state dict to every live replica under the checkpoint's tensor names (what
        SGLang's loader maps), cast to ``dtype`` when set; later samples carry the version. The tensors are
        kept until the next push: a replica that returns is sent them again."""
        if not state_dict:
            raise RingzeroError("update_weights: no tensors to send")
        from ringzero.model.hf_format import hf_tensors

        state_dict = {
            k: (
                v.to(self.dtype)
                if self.dtype is not None and v.is_floating_point() and "expert_bias" not in k
                else v
            )
            for k, v in hf_tensors(state_dict).items()
        }
        self._push(weight_version, lambda clients: self._broadcast_push(clients, state_dict, weight_version))
        self._last_sent = (state_dict, str(weight_version))

    def _broadcast_push(self, clients: list[ServerClient], state_dict: dict, weight_version: str) -> None:
        """One push over the weight group of exactly ``clients``: the group is (re)opened first when its
        members changed (a member lost leaves an NCCL group unusable; a new one must join)."""
        if self.group is None or self.broken is not None or self.members != [c.endpoint for c in clients]:
            self._reopen_group(clients)
        group = self.group
        names = list(state_dict)
        tensors = [self._on_device(state_dict[n]) for n in names]
        body = distributed_update_body(
            names,
            [str(t.dtype).removeprefix("torch.") for t in tensors],
            [list(t.shape) for t in tensors],
            self.current_group,
            weight_version,
        )
        try:
            push_phases(
                clients, weight_version, OneBroadcast(lambda: self._send(group, clients, body, tensors))
            )
        except Exception as exc:
            # A broadcast may still be in flight on some ranks: the group's next collective would not line up,
            # so the next push opens a new one.
            self.broken = str(exc)[:300]
            raise

    def _lose(self, client: ServerClient, exc: Exception) -> None:
        super()._lose(client, exc)
        if client.endpoint in self.members:  # a restarted server at the same address is not in the group
            self.broken = f"member {client.endpoint} lost"

    def _catch_up(self, back: list[ServerClient]) -> None:
        """Returning replicas join a new weight group with every live replica, and the last tensors are sent
        to all of them again (a broadcast reaches every member)."""
        if (
            self._last_sent is None
        ):  # another rank pushed: that rank catches it up; here its version is checked
            return
        state_dict, version = self._last_sent
        try:
            self._broadcast_push([*self.live(), *back], state_dict, version)
        except RingzeroError as exc:
            log.warning("rollout.rejoin_failed", replicas=[c.endpoint for c in back], error=str(exc)[:300])

    def _send(
        self, group: WeightGroup, clients: list[ServerClient], body: dict, tensors: list[torch.Tensor]
    ) -> None:
        """Post the update to every replica and broadcast while the posts wait; fail as soon as one
        refuses."""
        what = f"weight push {body['weight_version']!r}"
        with Pool(len(clients)) as pool:
            posts = [
                pool.submit(
                    named,
                    lambda c: c.update_weights_from_distributed(body, timeout_s=self.sync_timeout_s),
                    (c,),
                    what,
                )
                for c in clients
            ]
            works = group.broadcast(tensors)
            wait_all(works, posts, self.sync_timeout_s, f"broadcast of {len(tensors)} tensors")
            results(posts)

    def _reopen_group(self, clients: list[ServerClient]) -> None:
        """Leave the old group (its members that still answer are told to destroy it) and open a new one,
        under a new name and port, with exactly ``clients``."""
        if self.group is not None:
            old = self.current_group
            for c in clients:
                if c.endpoint in self.members:
                    try:
                        c.destroy_weights_update_group(old)
                    except RingzeroError as exc:
                        log.warning(
                            "rollout.weight_group_leave_failed", replica=c.endpoint, error=str(exc)[:200]
                        )
            self.group = None
            log.info("rollout.weight_group_reopen", old=old, members=[c.endpoint for c in clients])
        self.generation += 1
        self.group = self._open_group(clients)
        self.members, self.broken = [c.endpoint for c in clients], None

    @property
    def current_group(self) -> str:
        return self.group_name if self.generation <= 1 else f"{self.group_name}-{self.generation}"

    def _open_group(self, clients: list[ServerClient]) -> WeightGroup:
        address = self.master_address or own_address()
        port = self.master_port or free_port()
        world = 1 + len(clients) * self.tp_size
        name = self.current_group
        bodies = [
            init_group_body(address, port, offset, world, name, self.backend)
            for offset in rank_offsets(len(clients), self.tp_size)
        ]
        with Pool(len(clients) + 1) as pool:
            joins = [
                pool.submit(
                    named,
                    lambda c, b: c.init_weights_update_group(b, timeout_s=self.sync_timeout_s),
                    (c, b),
                    "weight group join",
                )
                for c, b in zip(clients, bodies, strict=True)
            ]
            opened = pool.submit(open_group, address, port, world, name, self.backend, self.sync_timeout_s)
            wait_all([], [*joins, opened], self.sync_timeout_s, f"weight group {name!r} at {address}:{port}")
            results(joins)
            group = opened.result()
        log.info(
            "rollout.weight_group",
            name=name,
            address=address,
            port=port,
            world_size=world,
            backend=self.backend,
        )
        return group

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if self.backend == "nccl" and t.device.type != "cuda":
            t = t.to(torch.device("cuda", torch.cuda.current_device()))
        return t.contiguous()
