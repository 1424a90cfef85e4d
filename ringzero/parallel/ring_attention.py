"""Ring attention: causal softmax attention over a sequence sharded across a CP group.

Each rank keeps its queries; the key/value shards (with their positions) travel around the ring, one
hop per step, P-1 hops in the forward. Each step's partial output is merged by log-sum-exp. A row that
sees no key in a block (its keys lie in the future, or a zigzag rank's early chunk) has ``lse = -inf``
there and is left untouched by the merge instead of turning into NaN. Shards are handled in pieces of
at most ``PIECE_ROWS`` tokens that never straddle a chunk (2 chunks per shard under zigzag); a pair of
query and key pieces that no query can see is not computed at all, which is where zigzag sharding's
load balance comes from, and the score matrices stay ``PIECE_ROWS`` square.

The backward is a second ring: key/value blocks travel again together with their gradient
accumulators, each rank adds its queries' contribution, and after P-1 hops one last hop returns every
block's accumulated dK/dV to its owner (P sequential hops). The block gradients use the saved
output and log-sum-exp (the FlashAttention recurrences), so no partial results are kept per step.

Letter legend: B batch, Q local query tokens, K tokens of one key block, H heads, D q/k dim, E value dim.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.model.attention import causal_attention, visible_mask
from ringzero.model.precision import at_least_fp32
from ringzero.parallel.comm import CallRecord, book_p2p, book_step, nbytes, wait_all


def _ring_peers(group) -> tuple[int, int]:
    """Global ranks of the next and previous member of the ring."""
    size, me = dist.get_world_size(group), dist.get_rank(group)
    return dist.get_global_rank(group, (me + 1) % size), dist.get_global_rank(group, (me - 1) % size)


def _exchange(tensors: list[torch.Tensor], group, rec: CallRecord | None, backward: bool):
    """Send ``tensors`` to the next rank and receive the same shapes from the previous one (async)."""
    nxt, prv = _ring_peers(group)
    sent = [t.contiguous() for t in tensors]  # referenced by the caller until the hop is waited on
    received = [torch.empty_like(t) for t in sent]
    # One batch of paired sends/receives: NCCL needs them grouped to avoid a cyclic wait; gloo accepts it.
    ops = []
    for t, r in zip(sent, received, strict=True):
        ops.append(dist.P2POp(dist.isend, t, nxt, group))
        ops.append(dist.P2POp(dist.irecv, r, prv, group))
    works = dist.batch_isend_irecv(ops)
    size = sum(nbytes(t) for t in sent)
    book_p2p(rec, backward, size, size)
    book_step(rec, backward, size)
    return received, (works, sent)


def _any_visible(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """Cheap test whether any query can see any key of a block (else the block is skipped)."""
    return bool(((k_pos >= 0) & (k_pos <= q_pos.max())).any())


def merge_partial(o_BQHE, lse_BQH, o_blk_BQHE, lse_blk_BQH):
    """Log-sum-exp merge of two partial attentions over disjoint key sets.

    Rows with ``-inf`` on both sides (no key seen yet) stay at zero output and ``-inf``."""
    top = torch.maximum(lse_BQH, lse_blk_BQH)
    ref = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w_a, w_b = torch.exp(lse_BQH - ref), torch.exp(lse_blk_BQH - ref)
    total = w_a + w_b
    seen = total > 0
    safe = torch.where(seen, total, torch.ones_like(total))
    o = (w_a[..., None] * o_BQHE + w_b[..., None] * o_blk_BQHE) / safe[..., None]
    lse = torch.where(seen, ref + torch.log(safe), lse_BQH)
    return o, lse


PIECE_ROWS = 512


def _pieces(length: int, chunks: int) -> list[slice]:
    """Slices of at most ``PIECE_ROWS`` rows, none straddling a chunk boundary."""
    C = length // chunks
    return [
        slice(s, min(s + PIECE_ROWS, (c + 1) * C))
        for c in range(chunks)
        for s in range(c * C, (c + 1) * C, PIECE_ROWS)
    ]


def _block_grads(q, k, v, q_pos, k_pos, lse, do_acc, delta, scale, compute):
    """dq, dk, dv of one key block given the final output's log-sum-exp (all in ``compute`` dtype)."""
    qc, kc, vc, doc = q.to(compute), k.to(compute), v.to(compute), do_acc.to(compute)
    visible_B1QK = visible_mask(q_pos, k_pos)[:, None]
    s_BHQK = torch.einsum("bqhd,bkhd->bhqk", qc, kc) * scale
    # Rows with lse = -inf see no key anywhere; the mask zeroes them before the inf can spread.
    p_BHQK = torch.exp(s_BHQK - lse.to(compute).transpose(1, 2)[..., None]).masked_fill(~visible_B1QK, 0.0)
    dv = torch.einsum("bhqk,bqhe->bkhe", p_BHQK, doc)
    dp_BHQK = torch.einsum("bqhe,bkhe->bhqk", doc, vc)
    ds_BHQK = p_BHQK * (dp_BHQK - delta.to(compute).transpose(1, 2)[..., None])
    dq = torch.einsum("bhqk,bkhd->bqhd", ds_BHQK, kc) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", ds_BHQK, qc) * scale
    return dq, dk, dv


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_BQHD, k_BKHD, v_BKHE, pos, scale, softmax_fp32, group, rec, pieces):
        P = dist.get_world_size(group)
        parts = _pieces(q_BQHD.shape[1], pieces)
        acc = at_least_fp32(q_BQHD.dtype)
        B, Q, H, _ = q_BQHD.shape
        o_BQHE = q_BQHD.new_zeros((B, Q, H, v_BKHE.shape[-1]), dtype=acc)
        lse_BQH = q_BQHD.new_full((B, Q, H), float("-inf"), dtype=acc)
        # Under the softmax island the partial outputs stay fp32 until the final cast, as in one process.
        q_in = q_BQHD.to(acc) if softmax_fp32 else q_BQHD
        block = [k_BKHD, v_BKHE, pos]
        for step in range(P):
            # Start the next hop before computing this block, so the transfer overlaps the compute.
            incoming, hop = _exchange(block, group, rec, False) if step < P - 1 else (None, ([], []))
            k_blk, v_blk, k_pos = block
            kv_in = (k_blk.to(acc), v_blk.to(acc)) if softmax_fp32 else (k_blk, v_blk)
            for qi in parts:
                for kj in parts:
                    if not _any_visible(pos[..., qi], k_pos[..., kj]):
                        continue
                    o_blk, lse_blk = causal_attention(
                        q_in[:, qi],
                        kv_in[0][:, kj],
                        kv_in[1][:, kj],
                        pos[..., qi],
                        k_pos[..., kj],
                        scale,
                        softmax_fp32,
                        return_lse=True,
                    )
                    o_BQHE[:, qi], lse_BQH[:, qi] = merge_partial(
                        o_BQHE[:, qi], lse_BQH[:, qi], o_blk.to(acc), lse_blk.to(acc)
                    )
            wait_all(*hop[0])
            block = incoming
        ctx.save_for_backward(q_BQHD, k_BKHD, v_BKHE, pos, o_BQHE, lse_BQH)
        ctx.scale, ctx.softmax_fp32, ctx.group, ctx.rec, ctx.parts = scale, softmax_fp32, group, rec, parts
        return o_BQHE.to(q_BQHD.dtype)

    @staticmethod
    def backward(ctx, do_BQHE):
        q, k, v, pos, o_acc, lse = ctx.saved_tensors
        group, rec = ctx.group, ctx.rec
        P = dist.get_world_size(group)
        acc = o_acc.dtype
        compute = acc if ctx.softmax_fp32 else q.dtype
        do_acc = do_BQHE.to(acc)
        delta_BQH = (do_acc * o_acc).sum(-1)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        block = [
            k,
            v,
            pos,
            torch.zeros(k.shape, dtype=acc, device=k.device),
            torch.zeros(v.shape, dtype=acc, device=v.device),
        ]
        for step in range(P):
            k_blk, v_blk, k_pos, dk_blk, dv_blk = block  # dk/dv: fresh buffers of this step, updated in place
            for qi in ctx.parts:
                for kj in ctx.parts:
                    if not _any_visible(pos[..., qi], k_pos[..., kj]):
                        continue
                    dq_b, dk_b, dv_b = _block_grads(
                        q[:, qi],
                        k_blk[:, kj],
                        v_blk[:, kj],
                        pos[..., qi],
                        k_pos[..., kj],
                        lse[:, qi],
                        do_acc[:, qi],
                        delta_BQH[:, qi],
                        ctx.scale,
                        compute,
                    )
                    dq[:, qi] += dq_b
                    dk_blk[:, kj] += dk_b
                    dv_blk[:, kj] += dv_b
            if step < P - 1:
                block, hop = _exchange([k_blk, v_blk, k_pos, dk_blk, dv_blk], group, rec, True)
            else:
                # The block in hand belongs to the next rank: one more hop brings each owner its dK/dV.
                block, hop = _exchange([dk_blk, dv_blk], group, rec, True)
            wait_all(*hop[0])
        dk, dv = block
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def ring_attention(
    q_BQHD,
    k_BKHD,
    v_BKHE,
    positions,
    scale: float,
    softmax_fp32: bool,
    group,
    rec: CallRecord | None = None,
    pieces: int = 1,
):
    """Causal attention of the local queries over the keys of every rank of ``group``.

    ``positions`` (``[Q]`` or ``[B, Q]``, global, negative = padding) belong to the local tokens; keys
    carry their own positions around the ring, so any sharding (contiguous, zigzag, padded) is computed
    correctly. ``pieces`` (the chunks per shard, 2 under zigzag) only decides what can be skipped."""
    if q_BQHD.shape[1] % pieces:
        raise ValueError(f"local length {q_BQHD.shape[1]} does not split into {pieces} chunks")
    return RingAttention.apply(q_BQHD, k_BKHD, v_BKHE, positions, scale, softmax_fp32, group, rec, pieces)
