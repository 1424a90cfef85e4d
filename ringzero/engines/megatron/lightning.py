"""Ling 2.5's Lightning linear-attention layer as a megatron-core module, with heads split over tensor
parallelism; the math is ``ringzero.model.lightning``'s (core, decay slopes), ``ringzero.model.rope``
and ``ringzero.model.norms``, so a layer here computes exactly what ``LightningAttention`` does.

Use it as a ``TransformerLayer``'s ``self_attention``:
``ModuleSpec(LightningSelfAttention, params={"model_config": cfg, "policy": policy})``. The call is
megatron's attention contract: ``forward(hidden_states [S, B, D], attention_mask=None, ...)`` returns
``(out [S, B, D], None)``; under sequence parallelism the input and output are ``[S/tp, B, D]`` (the
column-parallel projections gather the sequence, the row-parallel one scatters it back).

Tensor parallelism (the TP group is read from ``parallel_state`` at build time): rank ``r`` holds heads
``r*Hl .. (r+1)*Hl - 1``, ``Hl = H / tp``:
- ``query_key_value`` (column-parallel, stride 3): ringzero's fused rows are all q heads, then all k,
  then all v, so this rank's shard is its q heads, its k heads and its v heads, in that order (a
  stride-3 split of the full weight, which is what megatron's ``partition_stride=3`` means);
- ``g_proj`` column-parallel, ``dense`` row-parallel, ``g_norm`` sharded by channel: its groups span
  ``H*d / group_norm_size`` channels, so the heads of a rank must hold whole groups
  (``group_norm_size % tp == 0``);
- ``query_layernorm``/``key_layernorm`` are shared by all heads, so each rank's gradient covers its
  heads only: it is summed over TP inside the backward (``AllReduceGrad``), every rank then holds the
  full gradient and megatron's gradient finalization must not sum it again (their names do not match
  its ``q_layernorm``/``k_layernorm`` rule, so it does not);
- the decay slopes are indexed by the *global* head and scaled by the layer factor of the global layer
  index (``layer_number - 1``), as ``decay_slopes`` computes them for the whole model.

Positions are the global positions ``MegatronLM`` threads through the decoder as megatron's
``attention_mask`` argument (``[B, S]``, negative = padding, whose keys and values are zeroed as in
``LightningAttention``); ``0..S-1`` when none is given. Context parallelism (``context_parallel_size`` >
1 in megatron's parallel state) is ringzero's ``allgather`` core (LASP-2: one all-gather of each chunk's
state, ``lightning_cp.LightningAllGatherCore``) over megatron's CP group, on zigzag shards: the layout
megatron's MLA ropes, so both layer types of one model see the same tokens.

Letter legend: S sequence, B batch, D model, H heads (Hl on this rank), d head_dim.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.module import MegatronModule

from ringzero.engines.megatron.cpu_shim import AllReduceGrad
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.lightning import decay_slopes, lightning_blocks
from ringzero.model.norms import GroupRMSNorm, RMSNorm, rms_norm
from ringzero.model.precision import state_dtype
from ringzero.model.rope import apply_rope, rope_cos_sin
from ringzero.parallel.comm import CommLedger
from ringzero.parallel.lightning_cp import LightningAllGatherCore


class LightningSelfAttention(MegatronModule):
    def __init__(
        self,
        config,
        submodules=None,
        layer_number: int = 1,
        attn_mask_type=None,
        pg_collection=None,
        cp_comm_type=None,
        *,
        model_config: ModelConfig,
        policy: PrecisionPolicy,
        ledger: CommLedger | None = None,
    ):
        super().__init__(config=config)
        cfg = model_config
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_group = parallel_state.get_tensor_model_parallel_group() if self.tp_size > 1 else None
        rank = parallel_state.get_tensor_model_parallel_rank()
        H, d, G = cfg.num_attention_heads, cfg.head_dim, cfg.group_norm_size
        # the model refused a split leaving a rank part of a head or a norm group (config.megatron_split)
        assert H % self.tp_size == 0 and G % self.tp_size == 0
        self.heads = H // self.tp_size
        self.head_dim, self.block_size = d, cfg.lightning_block_size
        self.rope_dim, self.rope_theta = cfg.linear_rope_dim, cfg.rope_theta
        slopes = decay_slopes(H, layer_number - 1, cfg.num_hidden_layers)
        self.slopes = slopes[rank * self.heads : (rank + 1) * self.heads]
        self.state_dtype = state_dtype(policy)
        inner = H * d
        common = dict(config=config, init_method=config.init_method, bias=False, skip_bias_add=True)
        self.query_key_value = ColumnParallelLinear(
            cfg.hidden_size, 3 * inner, gather_output=False, stride=3, **common
        )
        self.g_proj = ColumnParallelLinear(cfg.hidden_size, inner, gather_output=False, **common)
        self.dense = RowParallelLinear(
            inner,
            cfg.hidden_size,
            input_is_parallel=True,
            **{**common, "init_method": config.output_layer_init_method},
        )
        if cfg.use_qk_norm:
            self.query_layernorm = RMSNorm(d, cfg.rms_norm_eps)
            self.key_layernorm = RMSNorm(d, cfg.rms_norm_eps)
        else:
            self.query_layernorm = self.key_layernorm = None
        self.g_norm = GroupRMSNorm(G // self.tp_size, inner // G, cfg.rms_norm_eps)
        set_tensor_model_parallel_attributes(self.g_norm.weight, True, 0, 1)
        self.core = None  # the single-device block form
        if parallel_state.get_context_parallel_world_size() > 1:
            self.core = LightningAllGatherCore(
                parallel_state.get_context_parallel_group(),
                ledger if ledger is not None else CommLedger(),
                "zigzag",
            )

    def log_decay(self, device=None) -> torch.Tensor:
        """``[Hl]``: this rank's heads, built from floats on each call (never rounded by a cast)."""
        return -torch.tensor(self.slopes, dtype=self.state_dtype, device=device)

    def forward(self, hidden_states, attention_mask=None, **unused):
        qkv_SBf, _ = self.query_key_value(hidden_states)
        gate_SBf, _ = self.g_proj(hidden_states)
        S, B = qkv_SBf.shape[:2]  # the whole sequence, also under sequence parallelism
        Hl, d = self.heads, self.head_dim
        q, k, v = qkv_SBf.transpose(0, 1).reshape(B, S, 3 * Hl, d).split(Hl, dim=2)
        if self.query_layernorm is not None:
            q = _shared_norm(self.query_layernorm, q, self.tp_group)
            k = _shared_norm(self.key_layernorm, k, self.tp_group)
        positions = attention_mask if attention_mask is not None else torch.arange(S, device=q.device)
        if self.rope_dim:
            cos, sin = rope_cos_sin(positions, self.rope_dim, self.rope_theta, q.dtype)
            r = self.rope_dim
            q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)
            k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        q = q * d**-0.5
        keep = (positions >= 0).to(k.dtype)
        keep = keep[None, :, None, None] if keep.dim() == 1 else keep[:, :, None, None]
        k, v = k * keep, v * keep
        if self.core is None:
            o_BSHd, _ = lightning_blocks(q, k, v, self.log_decay(q.device), self.block_size)
        else:
            o_BSHd = self.core(q, k, v, self.log_decay(q.device), self.block_size)
        o_SBf = self.g_norm(o_BSHd.flatten(2)).transpose(0, 1)
        out, _ = self.dense(torch.sigmoid(gate_SBf) * o_SBf)
        return out, None


def _shared_norm(norm: RMSNorm, x: torch.Tensor, tp_group) -> torch.Tensor:
    """``norm(x)`` whose weight gradient is summed over the heads of every TP rank."""
    if tp_group is None:
        return norm(x)
    return rms_norm(x, AllReduceGrad.apply(norm.weight, tp_group), norm.eps)
