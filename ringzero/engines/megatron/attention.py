"""The core attention of megatron's ``MLASelfAttention`` in the megatron engine: ringzero's softmax island
over global positions, with context parallelism over the heads (all-to-all).

megatron's MLA up-projects the latent itself, so its core attention receives per-head ``query``, ``key``
``[S, B, h, n+p]`` and ``value`` ``[S, B, h, v]`` (``h`` = heads of this TP rank), keys already roped at
the global positions of this rank's tokens (its rotary embedding takes the zigzag chunks of each CP rank:
``sharding: zigzag``). What it does not have is a core that runs without Transformer Engine under CP (the
local ``DotProductAttention`` refuses CP) nor ringzero's FP32 island (``attention_softmax_in_fp32`` keeps
QK^T in the body dtype). This core is both:

- the visibility comes from the positions ``MegatronLM`` threads through the decoder as megatron's
  ``attention_mask`` argument (``[B, S]`` global positions, negative = padding): key j is visible to
  query i iff ``0 <= pos_j <= pos_i``, as in every ringzero attention;
- the attention is ``ringzero.model.attention``'s, ``impl`` (``explicit`` | ``sdpa``) the model's
  ``mla_attention_impl``, ``softmax_fp32`` the policy's island: q, k, v are cast to fp32 before the
  scores and the output cast back (``causal_attention``);
- at CP > 1, one all-to-all moves q, k, v from sequence shards to head shards (each CP rank then holds
  ``h / cp`` heads of every token), the positions are all-gathered, full-sequence causal attention runs
  as in ringzero's ``a2a`` core (``mla_cp.full_sequence_attention``), and a second all-to-all returns the
  outputs to sequence shards (DeepSpeed-Ulysses over heads). Backward: the same two all-to-alls the other
  way. It moves per-head K/V, ``h (2(n+p) + v)`` values per token, where the torch engine's ``a2a`` moves
  the latent (``r + p``) and gathers queries: megatron's MLA has already expanded the heads when the core
  is called. ``h % cp == 0`` is required (refused at build).

Letter legend: S local tokens, T tokens of the whole sequence, B batch, h heads of this TP rank (``hc`` of
this CP rank), d q/k head width, v value width.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.transformer.module import MegatronModule

from ringzero.errors import RingzeroError
from ringzero.parallel.comm import CommLedger, HeadsToSeq, SeqToHeads, all_gather_dim0
from ringzero.parallel.mla_cp import full_sequence_attention


class MLACoreAttention(MegatronModule):
    """Build through a ``ModuleSpec`` with ``params={"impl": ..., "softmax_fp32": ..., "ledger": ...}``;
    megatron passes the rest (``k_channels``/``v_channels`` size the output, ``softmax_scale`` scales)."""

    def __init__(
        self,
        config,
        layer_number=None,
        attn_mask_type=None,
        attention_type=None,
        attention_dropout=None,
        softmax_scale=None,
        k_channels=None,
        v_channels=None,
        cp_comm_type=None,
        pg_collection=None,
        *,
        impl: str,
        softmax_fp32: bool,
        ledger: CommLedger | None = None,
    ):
        super().__init__(config=config)
        # megatron's Attention base builds a core without a scale, which MLA then replaces with its own
        self.scale, self.softmax_fp32 = softmax_scale, softmax_fp32
        self.attend = full_sequence_attention(impl)
        self.impl = impl
        self.cp = parallel_state.get_context_parallel_world_size()
        self.cp_group = parallel_state.get_context_parallel_group() if self.cp > 1 else None
        self.ledger = ledger if ledger is not None else CommLedger()
        # the model refused a split that leaves a CP rank part of a head (config.megatron_split)
        assert config.num_attention_heads // config.tensor_model_parallel_size % self.cp == 0

    def extra_repr(self) -> str:
        return f"impl={self.impl}, cp={self.cp}, softmax_fp32={self.softmax_fp32}"

    def forward(
        self,
        query,
        key,
        value,
        attention_mask=None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ):
        if self.scale is None:
            raise RingzeroError(
                "MLACoreAttention was built without the softmax_scale megatron's MLA computes"
            )
        if attention_bias is not None or packed_seq_params is not None:
            raise RingzeroError("MLACoreAttention takes neither an attention bias nor packed sequences")
        q_BShd, k_BShd, v_BShv = (t.transpose(0, 1) for t in (query, key, value))
        B, S = q_BShd.shape[:2]
        pos_BS = (
            attention_mask
            if attention_mask is not None
            else torch.arange(S, device=query.device).expand(B, S)
        )
        if self.cp == 1:
            o_BShv = self.attend(q_BShd, k_BShd, v_BShv, pos_BS, self.scale, self.softmax_fp32)
        else:
            rec = self.ledger.new_call("mla", "a2a-heads")
            q, k, v = (SeqToHeads.apply(t, self.cp_group, rec) for t in (q_BShd, k_BShd, v_BShv))
            # group-rank order, the order the all-to-all concatenates the tokens in
            pos_all, _ = all_gather_dim0(pos_BS.t().contiguous(), self.cp_group)
            o_BThv = self.attend(q, k, v, pos_all.t(), self.scale, self.softmax_fp32)
            o_BShv = HeadsToSeq.apply(o_BThv, self.cp_group, rec)
        return o_BShv.transpose(0, 1).flatten(2)
