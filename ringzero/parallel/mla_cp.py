"""Context-parallel cores for MLA layers: ``a2a`` (heads over ranks) and ``ring`` (the reference).

Both have the call of the single-device ``MLACore``; the layer around them is unchanged.

``a2a`` (all-to-all over heads). The latent ``[c_kv; k_rope]`` has no head axis, so every rank
all-gathers it over the sequence; at the same time one all-to-all moves the queries from sequence
shards to head shards. Each rank then up-projects the whole sequence's latent with its own heads' slice
of ``W_uk``/``W_uv`` and runs full-sequence causal attention for H/P heads, and a second all-to-all
returns the outputs to sequence shards. That attention is the layer's own choice
(``model.mla_attention_impl``, read from the single-device core that ``parallelize`` replaces):
``explicit`` runs the written-out softmax island in blocks of queries, each over only the keys it can
see (``blocked_causal_attention``, scores ``O(block x T)`` per head, all kept for backward: ``O(T^2 h)``
per rank); ``sdpa`` runs ``sdpa_causal_attention`` on the tokens put in position order, where
visibility is plain ``j <= i`` and the fused kernel needs no mask (``sdpa_full_sequence_attention``,
``O(T h)`` per rank). Backward: all-to-all of dO, then of dQ together with a reduce-scatter of the
latent's gradient. Two sequential steps each way, whatever P. A rank's ``W_uk``/``W_uv`` gradient
covers only its heads; summing gradients over the CP group (as for every replicated weight,
``sync_grads``) completes it.

``ring``: each rank materialises per-head K/V for its own tokens and runs ring attention over them
(P-1 sequential hops forward, P backward), moving ``H (dn+dr+dv)`` values per token instead of
``r + dr``. It always runs the explicit function, whatever the layer's impl: merging the partial
results of key blocks needs their log-sum-exp, which only ``causal_attention`` returns.

Letter legend: B batch, S local tokens, T tokens of the whole sequence, H heads, h = H/P heads of this
rank, n qk_nope_head_dim, p qk_rope_head_dim, v v_head_dim, r kv_lora_rank, c = r + p latent width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ringzero.errors import RingzeroError
from ringzero.model.attention import attention_fn, causal_attention, sdpa_causal_attention
from ringzero.parallel.comm import (
    CommLedger,
    HeadsToSeq,
    all_gather_dim0,
    all_to_all_dim0,
    book_all_gather,
    book_all_to_all,
    book_step,
    pack_heads_to_seq,
    pack_seq_to_heads,
    reduce_scatter_dim0,
    unpack_heads_to_seq,
    unpack_seq_to_heads,
    wait_all,
)
from ringzero.parallel.ring_attention import ring_attention
from ringzero.parallel.sharding import chunks_per_rank


def _seq_first(x: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """Sequence axis to the front, where the dim-0 collectives split and concatenate."""
    return x.movedim(seq_dim, 0).contiguous()


def _seq_back(x: torch.Tensor, seq_dim: int) -> torch.Tensor:
    return x.movedim(0, seq_dim)


class _GatherLatentScatterQueries(torch.autograd.Function):
    """Step 1 of ``a2a``: all-gather latent and positions, all-to-all queries, issued together.

    In: q ``[B, S, H, n+p]``, latent ``[B, S, c]``, positions ``[S]`` or ``[B, S]``.
    Out: q ``[B, T, h, n+p]``, latent ``[B, T, c]``, positions of all T tokens (group-rank order)."""

    @staticmethod
    def forward(ctx, q_BSHd, latent_BSc, pos, group, rec):
        P = dist.get_world_size(group)
        lat_send = _seq_first(latent_BSc, 1)
        pos_send = _seq_first(pos, -1)  # positions are [S] or [B, S]
        q_send = pack_seq_to_heads(q_BSHd, P)
        lat_all, w1 = all_gather_dim0(lat_send, group, async_op=True)
        pos_all, w2 = all_gather_dim0(pos_send, group, async_op=True)
        q_recv, w3 = all_to_all_dim0(q_send, group, async_op=True)
        wait_all(w1, w2, w3)
        # Issued together, so one step whose link carries all three payloads.
        book_step(
            rec,
            False,
            book_all_gather(rec, False, lat_send, P)
            + book_all_gather(rec, False, pos_send, P)
            + book_all_to_all(rec, False, q_send, P),
        )
        ctx.group, ctx.rec = group, rec
        return unpack_seq_to_heads(q_recv), _seq_back(lat_all, 1), _seq_back(pos_all, -1)

    @staticmethod
    def backward(ctx, dq_BThd, dlatent_BTc, _dpos):
        group, rec = ctx.group, ctx.rec
        P = dist.get_world_size(group)
        dq_send = pack_heads_to_seq(dq_BThd, P)
        dlat_send = _seq_first(dlatent_BTc, 1)
        dq_recv, w1 = all_to_all_dim0(dq_send, group, async_op=True)
        # Every rank holds the latent gradient of all tokens from its own heads: sum over ranks, keep mine.
        dlat_mine, w2 = reduce_scatter_dim0(dlat_send, group, async_op=True)
        wait_all(w1, w2)
        book_step(
            rec, True, book_all_to_all(rec, True, dq_send, P) + book_all_to_all(rec, True, dlat_send, P)
        )
        return unpack_heads_to_seq(dq_recv), _seq_back(dlat_mine, 1), None, None, None


# Queries per block of the a2a core's full-sequence attention (see ``blocked_causal_attention``).
QUERY_BLOCK = 512


def _expand_heads(q_nope, q_rope, c_kv, k_rope, w_uk_hnr, w_uv_hvr):
    """The training form's per-head q, k, v from the latent (what ``mla_expanded`` attends over)."""
    h = w_uk_hnr.shape[0]
    k_nope = torch.einsum("btr,hnr->bthn", c_kv, w_uk_hnr)
    v = torch.einsum("btr,hvr->bthv", c_kv, w_uv_hvr)
    k = torch.cat([k_nope, k_rope[:, :, None].expand(-1, -1, h, -1)], dim=-1)
    return torch.cat([q_nope, q_rope], dim=-1), k, v


def blocked_causal_attention(
    q_BThd, k_BThd, v_BThv, pos, scale: float, softmax_fp32: bool, block: int | None = None
):
    """Full-sequence causal attention one block of queries at a time, each block over only the keys
    some of its queries can see: about half the work of one masked T x T product, and a score
    matrix of ``block x T`` instead of ``T x T``. Exact: the skipped keys are masked anyway."""
    T = q_BThd.shape[1]
    block = block or QUERY_BLOCK
    if T <= block:
        return causal_attention(q_BThd, k_BThd, v_BThv, pos, pos, scale, softmax_fp32)
    k_pos_any = pos if pos.dim() == 1 else pos.max(0).values  # a key is needed if any row can see it
    outs = []
    for start in range(0, T, block):
        rows = slice(start, start + block)
        q_pos = pos[..., rows]
        keys = ((k_pos_any >= 0) & (k_pos_any <= q_pos.max())).nonzero().squeeze(-1)
        outs.append(
            causal_attention(
                q_BThd[:, rows], k_BThd[:, keys], v_BThv[:, keys], q_pos, pos[..., keys], scale, softmax_fp32
            )
        )
    return torch.cat(outs, dim=1)


def _position_order(pos_T: torch.Tensor) -> torch.Tensor | None:
    """Indices of the tokens that can be seen (position >= 0), in position order; ``None`` when two of
    them share a position (then visibility is not ``j <= i`` in any order)."""
    keep = (pos_T >= 0).nonzero().squeeze(-1)
    order = keep[torch.argsort(pos_T[keep])]
    ordered = pos_T[order]
    if bool((ordered[1:] <= ordered[:-1]).any()):
        return None
    return order


def _ordered_sdpa(q_BThd, k_BThd, v_BThv, pos_T, scale: float, softmax_fp32: bool):
    """Rows sharing the positions ``pos_T``: the visible tokens gathered in position order, one plain
    causal SDPA call, outputs put back in place; tokens with negative positions (padding) get 0."""
    order = _position_order(pos_T)
    T = pos_T.numel()
    if (
        order is None
        or order.numel() == 0
        or (order.numel() == T and bool((order == torch.arange(T, device=order.device)).all()))
    ):
        # Shared positions or nothing but padding (the masked call), or already in order without
        # padding (plain causal, no copies).
        return sdpa_causal_attention(q_BThd, k_BThd, v_BThv, pos_T, pos_T, scale, softmax_fp32)
    ordered_pos = pos_T[order]
    o_BUhv = sdpa_causal_attention(
        q_BThd[:, order], k_BThd[:, order], v_BThv[:, order], ordered_pos, ordered_pos, scale, softmax_fp32
    )
    B, h, E = q_BThd.shape[0], q_BThd.shape[2], v_BThv.shape[-1]
    return o_BUhv.new_zeros(B, T, h, E).index_copy(1, order, o_BUhv)


def sdpa_full_sequence_attention(q_BThd, k_BThd, v_BThv, pos, scale: float, softmax_fp32: bool):
    """The a2a core's full-sequence attention through ``sdpa_causal_attention`` without a mask tensor.

    The gathered tokens are in group-rank order (zigzag shards are not in sequence order) and may carry
    padding (negative positions). Per row of positions, the tokens that can be seen are put in position
    order, where key j is visible to query i iff ``j <= i``: the call takes ``is_causal`` and the fused
    kernel never holds a ``T x T`` mask or score. Rows of ``[B, T]`` positions that differ are handled
    one at a time. The FP32 island is ``sdpa_causal_attention``'s: under ``softmax_fp32`` q, k, v are
    cast to fp32 (fp64 stays fp64) before the kernel and the output back after. Positions shared by two
    visible tokens (never in training) fall back to the kernel with the boolean visibility mask."""
    if pos.dim() == 1 or bool((pos == pos[:1]).all()):
        return _ordered_sdpa(q_BThd, k_BThd, v_BThv, pos if pos.dim() == 1 else pos[0], scale, softmax_fp32)
    return torch.cat(
        [
            _ordered_sdpa(
                q_BThd[b : b + 1], k_BThd[b : b + 1], v_BThv[b : b + 1], pos[b], scale, softmax_fp32
            )
            for b in range(pos.shape[0])
        ],
        dim=0,
    )


def full_sequence_attention(impl: str):
    """The a2a core's full-sequence causal attention for the layer's attention impl."""
    attention_fn(impl)  # refuse an unknown name
    return sdpa_full_sequence_attention if impl == "sdpa" else blocked_causal_attention


def check_heads(num_attention_heads: int, cp: int) -> str | None:
    if num_attention_heads % cp:
        return (
            f"a2a splits the {num_attention_heads} attention heads over {cp} CP ranks, which needs "
            "num_attention_heads % cp == 0 "
            f"(use a head count divisible by {cp}, or strategy 'ring')"
        )
    return None


class MLAAllToAllCore(nn.Module):
    """``impl`` (``explicit`` | ``sdpa``): the attention function of the per-head-group full-sequence
    attention, the layer's ``MLACore.impl`` (``parallelize`` passes it on)."""

    def __init__(self, group, ledger: CommLedger, impl: str = "explicit"):
        super().__init__()
        self.group, self.ledger = group, ledger
        full_sequence_attention(impl)  # refuse an unknown name at construction
        self.impl = impl

    def extra_repr(self) -> str:
        return f"impl={self.impl}"

    def forward(
        self,
        q_nope_BSHn,
        q_rope_BSHp,
        c_kv_BSr,
        k_rope_BSp,
        w_uk_Hnr,
        w_uv_Hvr,
        positions,
        scale: float,
        softmax_fp32: bool,
    ):
        P, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        H, n = q_nope_BSHn.shape[2], q_nope_BSHn.shape[3]
        problem = check_heads(H, P)
        if problem:
            raise RingzeroError(problem)
        rec = self.ledger.new_call("mla", "a2a")
        q_BSHd = torch.cat([q_nope_BSHn, q_rope_BSHp], dim=-1)
        latent_BSc = torch.cat([c_kv_BSr, k_rope_BSp], dim=-1)
        q_BThd, latent_BTc, pos_all = _GatherLatentScatterQueries.apply(
            q_BSHd, latent_BSc, positions, self.group, rec
        )
        r = c_kv_BSr.shape[-1]
        heads = slice(me * (H // P), (me + 1) * (H // P))
        q, k, v = _expand_heads(
            q_BThd[..., :n],
            q_BThd[..., n:],
            latent_BTc[..., :r],
            latent_BTc[..., r:],
            w_uk_Hnr[heads],
            w_uv_Hvr[heads],
        )
        o_BThv = full_sequence_attention(self.impl)(q, k, v, pos_all, scale, softmax_fp32)
        return HeadsToSeq.apply(o_BThv, self.group, rec)


class MLARingCore(nn.Module):
    """Explicit attention whatever the layer's impl: the log-sum-exp merge of key blocks needs it."""

    def __init__(self, group, ledger: CommLedger, sharding: str = "contiguous"):
        super().__init__()
        self.group, self.ledger, self.pieces = group, ledger, chunks_per_rank(sharding)

    def forward(
        self,
        q_nope_BSHn,
        q_rope_BSHp,
        c_kv_BSr,
        k_rope_BSp,
        w_uk_Hnr,
        w_uv_Hvr,
        positions,
        scale: float,
        softmax_fp32: bool,
    ):
        rec = self.ledger.new_call("mla", "ring")
        q_BSHd, k_BSHd, v_BSHv = _expand_heads(
            q_nope_BSHn, q_rope_BSHp, c_kv_BSr, k_rope_BSp, w_uk_Hnr, w_uv_Hvr
        )
        return ring_attention(
            q_BSHd, k_BSHd, v_BSHv, positions, scale, softmax_fp32, self.group, rec, self.pieces
        )
