"""Rank job of the SDPA-under-CP test (module level, so spawned ranks can import it)."""

from __future__ import annotations

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.parallel.dims import ParallelDims
from ringzero.parallel.parallelize import parallelize
from ringzero.parallel.sharding import SeqLayout

SEQ = 21


def sdpa_model_cfg() -> ModelConfig:
    # MoE from layer 1 on: routing is per token, so it must not care how the sequence is sharded.
    return ModelConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        layout="LMLM",
        intermediate_size=40,
        max_position_embeddings=64,
        head_dim=8,
        lightning_block_size=4,
        kv_lora_rank=10,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
        group_norm_size=2,
        mla_attention_impl="sdpa",
        num_experts=4,
        n_group=2,
        topk_group=1,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
    )


def cp_batch():
    """Two rows of ``SEQ`` tokens; row 1 left-padded by 3 (negative positions)."""
    ids = torch.randint(0, 40, (2, SEQ), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(SEQ).repeat(2, 1)
    pos[1] -= 3
    return ids, pos


def cp_forward_backward(ctx, cp: int) -> dict:
    """Every rank: the sdpa-configured model, parallelized with the default plan, on its shard of a
    left-padded fp64 batch; returns this rank's logits, its shard's positions and its local gradients."""
    groups = ctx.groups(ParallelDims(dp=1, cp=cp, world_size=cp))
    model = random_weights_(
        HybridLM(sdpa_model_cfg(), PrecisionPolicy.preset("fp64")), torch.Generator().manual_seed(0)
    )
    ids, pos = cp_batch()
    parallelize(model, groups)
    cores = sorted({type(layer.attention.core).__name__ for layer in model.layers})
    layout = SeqLayout(SEQ, cp, "contiguous")
    me = groups.cp_rank
    local_ids = layout.shard(ids, me, dim=1)
    local_pos = layout.shard(pos, me, dim=1, pad_value=-1)
    logits = model(local_ids, local_pos)
    logits.square().mean().backward()
    return {
        "logits": logits.detach(),
        "positions": local_pos,
        "cores": cores,
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
    }
