"""Communication accounting of the CP cores, and the collectives they share (booked as they run).

Every CP layer call gets a ``CallRecord``; each collective or ring hop it performs books, for the
forward or the backward, its sequential steps on the critical path and the bytes this rank sends and
receives. Byte counts are
the logical payload (what an optimal algorithm must move per rank), independent of how the backend
implements the collective:

- all-gather of ``n`` bytes per rank: sends and receives ``(P-1) n``
- all-to-all or reduce-scatter of ``N`` bytes per rank: sends and receives ``N (P-1) / P``
- point-to-point: the message size

Each step also books its *path bytes*: what this rank's link must carry before the step completes (the
bytes it sends in a collective step, one message per ring hop). Steps and path bytes together give the
critical path ``steps * latency + path_bytes / bandwidth``.

The same code runs on gloo (CPU) and NCCL (GPU); nothing here looks at the backend.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class PhaseCount:
    steps: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    path_bytes: int = 0

    def add(self, steps: int, sent: int, recv: int, path: int = 0) -> None:
        self.steps += steps
        self.bytes_sent += sent
        self.bytes_recv += recv
        self.path_bytes += path


@dataclass
class CallRecord:
    """Communication of one layer call: forward and backward booked separately."""

    layer_type: str
    strategy: str
    fwd: PhaseCount = field(default_factory=PhaseCount)
    bwd: PhaseCount = field(default_factory=PhaseCount)

    def phase(self, backward: bool) -> PhaseCount:
        return self.bwd if backward else self.fwd


class CommLedger:
    """Collects one ``CallRecord`` per CP layer call; ``metrics()`` sums them under ``cp/<layer>/...``."""

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []

    def new_call(self, layer_type: str, strategy: str) -> CallRecord:
        rec = CallRecord(layer_type, strategy)
        self.calls.append(rec)
        return rec

    def reset(self) -> None:
        self.calls.clear()

    def drain(self) -> dict[str, float]:
        """``metrics()`` then ``reset()``: what a training loop calls once per step."""
        out = self.metrics()
        self.reset()
        return out

    def metrics(self) -> dict[str, float]:
        """Totals since the last reset, plus per-call steps (layers run one after another, so the
        step totals are the CP part of the training step's critical path)."""
        totals: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for rec in self.calls:
            t = totals[rec.layer_type]
            t["calls"] += 1
            t["steps_fwd"] += rec.fwd.steps
            t["steps_bwd"] += rec.bwd.steps
            t["bytes_sent"] += rec.fwd.bytes_sent + rec.bwd.bytes_sent
            t["bytes_recv"] += rec.fwd.bytes_recv + rec.bwd.bytes_recv
            t["path_bytes"] += rec.fwd.path_bytes + rec.bwd.path_bytes
        out: dict[str, float] = {}
        for layer, t in sorted(totals.items()):
            for key, value in t.items():
                out[f"cp/{layer}/{key}"] = value
            out[f"cp/{layer}/steps"] = t["steps_fwd"] + t["steps_bwd"]
            out[f"cp/{layer}/steps_per_call"] = (t["steps_fwd"] + t["steps_bwd"]) / t["calls"]
        return out


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _all_gather_single(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False):
    # torch 2.13 renamed the tensor collectives; older releases only have the *_into_tensor names.
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _reduce_scatter_single(out: torch.Tensor, inp: torch.Tensor, group, async_op: bool = False):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def all_gather_dim0(x: torch.Tensor, group, async_op: bool = False):
    """``[n, ...]`` per rank -> ``[P*n, ...]`` in group-rank order. Returns (out, work)."""
    size = dist.get_world_size(group)
    out = x.new_empty((size * x.shape[0], *x.shape[1:]))
    work = _all_gather_single(out, x.contiguous(), group, async_op)
    return out, work


def reduce_scatter_dim0(x: torch.Tensor, group, async_op: bool = False):
    """``[P*n, ...]`` per rank -> ``[n, ...]``: block ``p`` summed over ranks lands on rank ``p``."""
    size = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] // size, *x.shape[1:]))
    work = _reduce_scatter_single(out, x.contiguous(), group, async_op)
    return out, work


def all_to_all_dim0(x: torch.Tensor, group, async_op: bool = False):
    """``[P*n, ...]`` per rank: block ``j`` goes to rank ``j``; block ``i`` of the result came from rank
    ``i``."""
    out = torch.empty_like(x)
    work = dist.all_to_all_single(out, x.contiguous(), group=group, async_op=async_op)
    return out, work


def book_all_gather(rec: CallRecord | None, backward: bool, per_rank: torch.Tensor, size: int) -> int:
    """Books the bytes of an all-gather; returns what this rank sends."""
    n = nbytes(per_rank) * (size - 1)
    if rec is not None:
        rec.phase(backward).add(0, n, n)
    return n


def book_all_to_all(rec: CallRecord | None, backward: bool, per_rank: torch.Tensor, size: int) -> int:
    """Books the bytes of an all-to-all or reduce-scatter; returns what this rank sends."""
    n = nbytes(per_rank) * (size - 1) // size
    if rec is not None:
        rec.phase(backward).add(0, n, n)
    return n


def book_step(rec: CallRecord | None, backward: bool, path_bytes: int, steps: int = 1) -> None:
    """``steps`` sequential steps on the critical path, carrying ``path_bytes`` over this rank's link."""
    if rec is not None:
        rec.phase(backward).add(steps, 0, 0, path_bytes)


def book_p2p(rec: CallRecord | None, backward: bool, sent: int, recv: int) -> None:
    if rec is not None:
        rec.phase(backward).add(0, sent, recv)


def wait_all(*works) -> None:
    for w in works:
        if w is not None:
            w.wait()


# Layout of the sequence <-> head all-to-all (legend: B batch, S local length, H heads, P CP size,
# h = H/P heads per rank, D feature dim). Block j of a send buffer goes to group rank j.


def pack_seq_to_heads(x_BSHD: torch.Tensor, P: int) -> torch.Tensor:
    """``[B, S, H, D]`` -> send buffer ``[P, B, S, h, D]``: head group j for rank j."""
    B, S, H, D = x_BSHD.shape
    return x_BSHD.reshape(B, S, P, H // P, D).permute(2, 0, 1, 3, 4).contiguous()


def unpack_seq_to_heads(recv_PBShD: torch.Tensor) -> torch.Tensor:
    """Received ``[P, B, S, h, D]`` (block i = rank i's tokens for my heads) -> ``[B, P*S, h, D]``."""
    P, B, S, h, D = recv_PBShD.shape
    return recv_PBShD.permute(1, 0, 2, 3, 4).reshape(B, P * S, h, D)


def pack_heads_to_seq(x_BThD: torch.Tensor, P: int) -> torch.Tensor:
    """``[B, P*S, h, D]`` -> send buffer ``[P, B, S, h, D]``: rank j's tokens for rank j."""
    B, T, h, D = x_BThD.shape
    return x_BThD.reshape(B, P, T // P, h, D).permute(1, 0, 2, 3, 4).contiguous()


def unpack_heads_to_seq(recv_PBShD: torch.Tensor) -> torch.Tensor:
    """Received ``[P, B, S, h, D]`` (block i = my tokens for head group i) -> ``[B, S, P*h, D]``."""
    P, B, S, h, D = recv_PBShD.shape
    return recv_PBShD.permute(1, 2, 0, 3, 4).reshape(B, S, P * h, D)


def seq_to_heads(x_BSHD: torch.Tensor, group, rec: CallRecord | None, backward: bool) -> torch.Tensor:
    """One booked all-to-all: ``[B, S, H, D]`` local tokens -> ``[B, P*S, h, D]`` my heads, all tokens."""
    P = dist.get_world_size(group)
    send = pack_seq_to_heads(x_BSHD, P)
    recv, _ = all_to_all_dim0(send, group)
    book_step(rec, backward, book_all_to_all(rec, backward, send, P))
    return unpack_seq_to_heads(recv)


def heads_to_seq(x_BThD: torch.Tensor, group, rec: CallRecord | None, backward: bool) -> torch.Tensor:
    """One booked all-to-all, the inverse of ``seq_to_heads``."""
    P = dist.get_world_size(group)
    send = pack_heads_to_seq(x_BThD, P)
    recv, _ = all_to_all_dim0(send, group)
    book_step(rec, backward, book_all_to_all(rec, backward, send, P))
    return unpack_heads_to_seq(recv)


class HeadsToSeq(torch.autograd.Function):
    """Autograd all-to-all from head shards back to sequence shards; the backward goes the other way."""

    @staticmethod
    def forward(ctx, x_BThD, group, rec):
        ctx.group, ctx.rec = group, rec
        return heads_to_seq(x_BThD, group, rec, backward=False)

    @staticmethod
    def backward(ctx, g_BSHD):
        return seq_to_heads(g_BSHD, ctx.group, ctx.rec, backward=True), None, None


class SeqToHeads(torch.autograd.Function):
    """Autograd all-to-all from sequence shards to head shards (``seq_to_heads``); the backward goes back."""

    @staticmethod
    def forward(ctx, x_BSHD, group, rec):
        ctx.group, ctx.rec = group, rec
        return seq_to_heads(x_BSHD, group, rec, backward=False)

    @staticmethod
    def backward(ctx, g_BThD):
        return heads_to_seq(g_BThD, ctx.group, ctx.rec, backward=True), None, None
