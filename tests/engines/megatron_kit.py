"""Shared pieces of the megatron engine tests: tiny configs, a random HybridLM, and the parity job that
runs on every rank (module level, so a gloo rank pool can import it).

Letter legend: B batch, S sequence, V vocab.
"""

from __future__ import annotations

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import token_logprobs
from ringzero.model.tolerances import compare


def tiny_config(q_lora_rank: int | None = None, rope_interleave: bool = True, tie: bool = False) -> ModelConfig:
    """Both layer kinds (Lightning, MLA, Lightning: two different decay factors), 2 heads (one per rank
    at TP = 2), Lightning blocks shorter than the sequence."""
    return ModelConfig(
        vocab_size=32, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, layout="LML",
        head_dim=8, partial_rotary_factor=0.5, group_norm_size=2, lightning_block_size=4,
        q_lora_rank=q_lora_rank, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        rope_interleave=rope_interleave, intermediate_size=48, tie_word_embeddings=tie,
        initializer_range=0.2,
    )


def random_hybrid(cfg: ModelConfig, policy: PrecisionPolicy, seed: int = 0) -> HybridLM:
    """A HybridLM with random weights, norms included (at 1 a norm's layout mistakes would not show)."""
    torch.manual_seed(seed)
    model = HybridLM(cfg, policy)
    gen = torch.Generator().manual_seed(seed)
    model.reset_parameters(gen)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
    return model


def weighted_logprob_loss(model, ids_BS: torch.Tensor, weights_BS: torch.Tensor):
    """(per-token log-probs of the next tokens ``[B, S-1]``, a weighted sum of them to differentiate)."""
    lp = token_logprobs(model(ids_BS)[:, :-1], ids_BS[:, 1:])
    return lp, (lp * weights_BS[:, :-1]).sum()


def parity(cfg: ModelConfig, seed: int = 0) -> dict:
    """MegatronLM vs HybridLM on identical fp32 weights, on this rank's TP group (parallel_state set up
    by the caller): ``compare`` records of the log-probs and of every parameter's gradient."""
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from ringzero.engines.megatron import cpu_shim
    from ringzero.engines.megatron.convert import hybrid_grads, hybrid_state, load_hybrid_state_
    from ringzero.engines.megatron.model import MegatronLM

    torch.set_num_threads(1)
    cpu_shim.apply()
    model_parallel_cuda_manual_seed(seed)
    policy = PrecisionPolicy.model_validate("fp32")
    ref = random_hybrid(cfg, policy, seed)
    mlm = MegatronLM(cfg, policy)
    load_hybrid_state_(mlm, ref.state_dict())
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=gen)
    weights = torch.randn(ids.shape, generator=gen)
    lp_ref, loss_ref = weighted_logprob_loss(ref, ids, weights)
    lp_mlm, loss_mlm = weighted_logprob_loss(mlm, ids, weights)
    loss_ref.backward()
    loss_mlm.backward()
    grads = hybrid_grads(mlm)
    expected = {n: p.grad for n, p in ref.named_parameters()}
    state_back = hybrid_state(mlm)
    return {
        "logprobs": compare(lp_mlm, lp_ref, torch.float32),
        "grads": {n: compare(grads[n], g, torch.float32) for n, g in expected.items()},
        "missing_grads": sorted(set(expected) - set(grads)),
        "state_round_trip": all(torch.equal(state_back[n], w) for n, w in ref.state_dict().items()),
    }


def parity_job(ctx, cfg: ModelConfig, tp: int) -> dict:
    """``parity`` on a gloo rank of a pool: megatron's parallel state for ``tp``, torn down afterwards."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        return parity(cfg)
    finally:
        parallel_state.destroy_model_parallel()
