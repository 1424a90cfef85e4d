"""Context-parallel cores for Lightning (decayed linear attention) layers: ``allgather`` and ``ring``.

With decay ``lambda = exp(log_decay)`` per head, a chunk of C tokens that starts from state ``h0`` has
output ``o_t = o_t(zero start) + lambda^(t+1) q_t h0`` (t counted from the chunk start) and ends in state
``lambda^C h0 + F``, where ``F`` is the chunk's zero-start final state. Each rank computes its chunks'
zero-start outputs and ``F`` locally; only the ``h0`` of each chunk needs the other ranks.

``allgather`` (LASP-2): one all-gather of every chunk's ``F``; chunk c starts from the decayed prefix sum
``h0_c = sum_{j<c} lambda^(C (c-1-j)) F_j``. Backward: one all-gather of every chunk's ``dh0`` and the
decayed suffix sum ``dF_j = sum_{c>j} lambda^(C (c-1-j)) dh0_c``. One step each way; ``(P-1)`` states of
``B H dk dv`` values per chunk, independent of the sequence length. Works for contiguous and zigzag
shards (chunks are placed by their global index).

``ring`` (LASP-1): rank p waits for rank p-1's end state, adds its own chunk and passes it on: P-1
sequential hops forward, P-1 back. Contiguous shards only.

States travel in at least fp32 (fp64 under an fp64 body): they sum thousands of decayed outer products.

Letter legend: B batch, S local tokens, C chunk length, H heads, k key/query head dim, v value head dim,
n chunks per rank, G = P*n chunks in the sequence.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ringzero.errors import RingzeroError
from ringzero.model.lightning import lightning_blocks
from ringzero.model.precision import at_least_fp32
from ringzero.parallel.comm import CommLedger, all_gather_dim0, book_all_gather, book_p2p, book_step, nbytes
from ringzero.parallel.sharding import chunk_ids, chunks_per_rank


def _prefix_weights(log_decay_H: torch.Tensor, chunk_len: int, n_chunks: int) -> torch.Tensor:
    """``W[c, j, h] = lambda_h^(C (c-1-j))`` for ``j < c``, else 0: ``h0_c = sum_j W[c, j] F_j``."""
    c = torch.arange(n_chunks, device=log_decay_H.device)
    gap_GG = (c[:, None] - 1 - c[None, :]).to(log_decay_H.dtype)
    w_GGH = torch.exp(log_decay_H * chunk_len * gap_GG.clamp(min=0)[..., None])
    return w_GGH * (c[:, None] > c[None, :])[..., None]


class _GatherPrefixStates(torch.autograd.Function):
    """``F [n, B, H, k, v]`` of this rank's chunks -> their start states ``h0 [n, B, H, k, v]``."""

    @staticmethod
    def forward(ctx, F_nBHkv, log_decay_H, chunk_len, group, rec, mode):
        P, me = dist.get_world_size(group), dist.get_rank(group)
        F_all, _ = all_gather_dim0(F_nBHkv, group)
        book_step(rec, False, book_all_gather(rec, False, F_nBHkv, P))
        # Gathered in group-rank order; place each chunk at its global index.
        order = torch.tensor([g for r in range(P) for g in chunk_ids(r, P, mode)], device=F_all.device)
        F_GBHkv = torch.empty_like(F_all).index_copy_(0, order, F_all)
        w_GGH = _prefix_weights(log_decay_H.to(F_all.dtype), chunk_len, F_all.shape[0])
        mine = torch.tensor(chunk_ids(me, P, mode), device=F_all.device)
        ctx.save_for_backward(w_GGH, order, mine)
        ctx.group, ctx.rec = group, rec
        return torch.einsum("cjh,jbhkv->cbhkv", w_GGH[mine], F_GBHkv)

    @staticmethod
    def backward(ctx, dh0_nBHkv):
        w_GGH, order, mine = ctx.saved_tensors
        group, rec = ctx.group, ctx.rec
        P = dist.get_world_size(group)
        dh0_all, _ = all_gather_dim0(dh0_nBHkv, group)
        book_step(rec, True, book_all_gather(rec, True, dh0_nBHkv, P))
        dh0_GBHkv = torch.empty_like(dh0_all).index_copy_(0, order, dh0_all)
        dF = torch.einsum("cjh,cbhkv->jbhkv", w_GGH[:, mine], dh0_GBHkv)
        return dF, None, None, None, None, None


def _p2p(op, tensor: torch.Tensor, peer_in_group: int, group):
    works = dist.batch_isend_irecv(
        [dist.P2POp(op, tensor, dist.get_global_rank(group, peer_in_group), group)]
    )
    for w in works:
        w.wait()


class _RingStates(torch.autograd.Function):
    """LASP-1: ``F [B, H, k, v]`` of this rank's chunk -> its start state, received from rank p-1."""

    @staticmethod
    def forward(ctx, F_BHkv, log_decay_H, chunk_len, group, rec):
        P, me = dist.get_world_size(group), dist.get_rank(group)
        decay_H11 = torch.exp(log_decay_H.to(F_BHkv.dtype) * chunk_len)[:, None, None]
        h0_BHkv = torch.zeros_like(F_BHkv)
        if me > 0:
            _p2p(dist.irecv, h0_BHkv, me - 1, group)
            book_p2p(rec, False, 0, nbytes(h0_BHkv))
        if me < P - 1:
            _p2p(dist.isend, (decay_H11 * h0_BHkv + F_BHkv).contiguous(), me + 1, group)
            book_p2p(rec, False, nbytes(F_BHkv), 0)
        # The whole chain (P-1 hops of one state), which the last rank's output waits on.
        book_step(rec, False, (P - 1) * nbytes(F_BHkv), steps=P - 1)
        ctx.save_for_backward(decay_H11)
        ctx.group, ctx.rec = group, rec
        return h0_BHkv

    @staticmethod
    def backward(ctx, dh0_BHkv):
        (decay_H11,) = ctx.saved_tensors
        group, rec = ctx.group, ctx.rec
        P, me = dist.get_world_size(group), dist.get_rank(group)
        # dL/d(end state of my chunk) is the next rank's total start-state gradient.
        dend_BHkv = torch.zeros_like(dh0_BHkv)
        if me < P - 1:
            _p2p(dist.irecv, dend_BHkv, me + 1, group)
            book_p2p(rec, True, 0, nbytes(dend_BHkv))
        if me > 0:
            _p2p(dist.isend, (dh0_BHkv + decay_H11 * dend_BHkv).contiguous(), me - 1, group)
            book_p2p(rec, True, nbytes(dend_BHkv), 0)
        book_step(rec, True, (P - 1) * nbytes(dend_BHkv), steps=P - 1)
        return dend_BHkv, None, None, None, None


def _chunk_inter(q_BCHk: torch.Tensor, h0_BHkv: torch.Tensor, log_decay_H: torch.Tensor) -> torch.Tensor:
    """``lambda^(t+1) q_t h0``: what the chunk's start state adds to each of its outputs."""
    t = torch.arange(1, q_BCHk.shape[1] + 1, device=q_BCHk.device, dtype=h0_BHkv.dtype)
    decay_CH = torch.exp(t[:, None] * log_decay_H.to(h0_BHkv.dtype))
    return torch.einsum("bchk,bhkv->bchv", q_BCHk.to(h0_BHkv.dtype) * decay_CH[..., None], h0_BHkv)


def _local_chunks(q, k, v, log_decay_H, block_size, n):
    """Zero-start outputs and final states of the ``n`` chunks of the local shard, in compute dtype."""
    S = q.shape[1]
    if S % n:
        raise RingzeroError(f"local length {S} does not split into {n} equal chunks")
    compute = torch.promote_types(at_least_fp32(q.dtype), log_decay_H.dtype)
    C = S // n
    outs, finals = [], []
    for i in range(n):
        part = slice(i * C, (i + 1) * C)
        o, F = lightning_blocks(
            q[:, part].to(compute), k[:, part].to(compute), v[:, part].to(compute), log_decay_H, block_size
        )
        outs.append(o)
        finals.append(F)
    return outs, torch.stack(finals), C


def _refuse_learnable_decay(log_decay_H: torch.Tensor) -> None:
    if log_decay_H.requires_grad:
        raise RingzeroError("Lightning CP cores treat the decay as fixed; got a log_decay that requires grad")


class LightningAllGatherCore(nn.Module):
    def __init__(self, group, ledger: CommLedger, mode: str = "contiguous"):
        super().__init__()
        self.group, self.ledger, self.mode = group, ledger, mode

    def forward(self, q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size: int):
        _refuse_learnable_decay(log_decay_H)
        rec = self.ledger.new_call("lightning", "allgather")
        n = chunks_per_rank(self.mode)
        outs, F_nBHkv, C = _local_chunks(q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size, n)
        h0_nBHkv = _GatherPrefixStates.apply(F_nBHkv, log_decay_H, C, self.group, rec, self.mode)
        # Every chunk uses its h0, also the first chunk's all-zero one: a rank whose graph skipped it
        # would skip the backward all-gather and leave the others waiting for it.
        o = [
            o_i + _chunk_inter(q_BSHk[:, i * C : (i + 1) * C], h0_nBHkv[i], log_decay_H)
            for i, o_i in enumerate(outs)
        ]
        return torch.cat(o, dim=1).to(q_BSHk.dtype)


class LightningRingCore(nn.Module):
    def __init__(self, group, ledger: CommLedger):
        super().__init__()
        self.group, self.ledger = group, ledger

    def forward(self, q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size: int):
        _refuse_learnable_decay(log_decay_H)
        rec = self.ledger.new_call("lightning", "ring")
        (o_local,), F_1BHkv, C = _local_chunks(q_BSHk, k_BSHk, v_BSHv, log_decay_H, block_size, 1)
        h0_BHkv = _RingStates.apply(F_1BHkv[0], log_decay_H, C, self.group, rec)
        return (o_local + _chunk_inter(q_BSHk, h0_BHkv, log_decay_H)).to(q_BSHk.dtype)
