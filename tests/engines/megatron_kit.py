"""Shared pieces of the megatron engine tests: tiny configs, a random HybridLM, and the parity job that
runs on every rank (module level, so a gloo rank pool can import it).

Letter legend: B batch, S sequence, V vocab, N tokens, E experts, K experts per token.
"""

from __future__ import annotations

import torch

import ringzero.engines.megatron  # noqa: F401  - megatron.core as ringzero imports it (eager_import)
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import token_logprobs
from ringzero.model.routing import capture_routing
from ringzero.model.tolerances import compare


def tiny_config(
    q_lora_rank: int | None = None, rope_interleave: bool = True, tie: bool = False
) -> ModelConfig:
    """Both layer kinds (Lightning, MLA, Lightning: two different decay factors), 2 heads (one per rank
    at TP = 2), Lightning blocks shorter than the sequence."""
    return ModelConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        layout="LML",
        head_dim=8,
        partial_rotary_factor=0.5,
        group_norm_size=2,
        lightning_block_size=4,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=8,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=8,
        rope_interleave=rope_interleave,
        intermediate_size=48,
        tie_word_embeddings=tie,
        initializer_range=0.2,
    )


def tiny_moe_config(tie: bool = False) -> ModelConfig:
    """``tiny_config`` with MoE layers from layer 1 on (one MLA, one Lightning): 4 experts in 2 groups,
    top 2 from the best group (megatron's group score is then ringzero's), one shared expert, a routed
    scaling factor that is not 1."""
    return tiny_config(tie=tie).model_copy(
        update=dict(
            num_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            moe_intermediate_size=16,
            num_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
        )
    )


def random_hybrid(cfg: ModelConfig, policy: PrecisionPolicy, seed: int = 0) -> HybridLM:
    """A HybridLM with random weights, norms included (at 1 a norm's layout mistakes would not show), and
    routing biases N(0, 0.1^2) that steer the choice of experts (drawn last: dense weights do not move)."""
    torch.manual_seed(seed)
    model = HybridLM(cfg, policy)
    gen = torch.Generator().manual_seed(seed)
    model.reset_parameters(gen)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.copy_(0.5 + torch.rand(p.shape, generator=gen))
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.copy_(0.1 * torch.randn(buf.shape, generator=gen))
    return model


def megatron_routing(mlm) -> tuple[dict[int, list[torch.Tensor]], list]:
    """Forward hooks recording each MoE layer's routing map ``[N, E]`` (bool, this rank's tokens), by
    layer index: ``(records, handles)``."""
    records: dict[int, list[torch.Tensor]] = {}
    handles = []
    for i, layer in enumerate(mlm.decoder.layers):
        router = getattr(layer.mlp, "router", None)
        if router is not None:
            records[i] = []
            handles.append(
                router.register_forward_hook(
                    lambda mod, args, out, i=i: records[i].append(out[1].detach().clone())
                )
            )
    return records, handles


def routing_agreement(
    ref_chosen: dict[int, torch.Tensor], records: dict[int, list[torch.Tensor]], B: int, S: int
) -> dict:
    """Per MoE layer: tokens whose chosen experts (as a set) agree, of how many; experts used. The megatron
    maps are gathered over TP (each rank routes a slice of the padded ``[S, B]`` tokens there)."""
    from megatron.core import parallel_state

    out = {}
    for i, chosen_BSK in ref_chosen.items():
        map_NE = records[i][0]
        if parallel_state.get_tensor_model_parallel_world_size() > 1:
            parts = [
                torch.empty_like(map_NE) for _ in range(parallel_state.get_tensor_model_parallel_world_size())
            ]
            torch.distributed.all_gather(
                parts, map_NE, group=parallel_state.get_tensor_model_parallel_group()
            )
            map_NE = torch.cat(parts)
        map_NE = map_NE[: S * B]
        E = map_NE.shape[1]
        chosen_NK = chosen_BSK.transpose(0, 1).reshape(S * B, -1)  # megatron's token order: s * B + b
        ref_NE = torch.zeros(S * B, E, dtype=torch.bool).scatter_(1, chosen_NK, True)
        out[i] = {
            "agree": int((ref_NE == map_NE).all(1).sum()),
            "tokens": S * B,
            "experts_used": int(ref_NE.any(0).sum()),
            "experts": E,
        }
    return out


def weighted_logprob_loss(model, ids_BS: torch.Tensor, weights_BS: torch.Tensor):
    """(per-token log-probs of the next tokens ``[B, S-1]``, a weighted sum of them to differentiate)."""
    lp = token_logprobs(model(ids_BS)[:, :-1], ids_BS[:, 1:])
    return lp, (lp * weights_BS[:, :-1]).sum()


def parity(cfg: ModelConfig, seed: int = 0, shape: tuple[int, int] = (2, 9)) -> dict:
    """MegatronLM vs HybridLM on identical fp32 weights, on this rank's TP group (parallel_state set up
    by the caller), on a random batch of ``shape`` [B, S]: ``compare`` records of the log-probs and of
    every parameter's gradient; for MoE models also the routing agreement per layer."""
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
    ids = torch.randint(0, cfg.vocab_size, shape, generator=gen)
    weights = torch.randn(ids.shape, generator=gen)
    with capture_routing(ref) as ref_chosen:
        lp_ref, loss_ref = weighted_logprob_loss(ref, ids, weights)
    records, handles = megatron_routing(mlm)
    lp_mlm, loss_mlm = weighted_logprob_loss(mlm, ids, weights)
    for h in handles:
        h.remove()
    loss_ref.backward()
    loss_mlm.backward()
    grads = hybrid_grads(mlm)
    expected = {n: p.grad for n, p in ref.named_parameters()}
    state_back = hybrid_state(mlm)
    return {
        "logprobs": compare(lp_mlm, lp_ref, torch.float32),
        "grads": {n: compare(grads[n], g, torch.float32) for n, g in expected.items()},
        "missing_grads": sorted(set(expected) - set(grads)),
        "state_round_trip": set(state_back) == set(ref.state_dict())
        and all(torch.equal(state_back[n], w) for n, w in ref.state_dict().items()),
        "routing": routing_agreement(ref_chosen, records, *shape),
    }


def parity_job(ctx, cfg: ModelConfig, tp: int, shape: tuple[int, int] = (2, 9)) -> dict:
    """``parity`` on a gloo rank of a pool: megatron's parallel state for ``tp``, torn down afterwards."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    try:
        return parity(cfg, shape=shape)
    finally:
        parallel_state.destroy_model_parallel()


def cp_parity(
    cfg: ModelConfig, seed: int = 0, shape: tuple[int, int] = (2, 11), policy: str = "fp32"
) -> dict:
    """MegatronLM under context parallelism (megatron's parallel state set up by the caller with cp > 1)
    vs HybridLM on the whole sequence, identical weights: each CP rank takes its zigzag shard of the input
    columns with their global positions (layout padding at -1), scores its next tokens, and the
    gradients of the loss summed over its tokens are summed over the CP group (then gathered over TP).
    Returns ``compare`` records of the log-probs (the whole ``[B, W]`` grid) and of every gradient, and
    the comm ledger's calls."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from ringzero.engines.megatron import cpu_shim
    from ringzero.engines.megatron.convert import hybrid_grads, load_hybrid_state_
    from ringzero.engines.megatron.model import MegatronLM
    from ringzero.parallel.sharding import SeqLayout

    torch.set_num_threads(1)
    cpu_shim.apply()
    model_parallel_cuda_manual_seed(seed)
    pol = PrecisionPolicy.model_validate(policy)
    dtype = torch.float64 if policy == "fp64" else torch.float32
    ref = random_hybrid(cfg, pol, seed)
    mlm = MegatronLM(cfg, pol)
    load_hybrid_state_(mlm, ref.state_dict())
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, shape, generator=gen)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    weights = torch.randn(targets.shape, generator=gen, dtype=dtype)
    lp_ref = token_logprobs(ref(inputs), targets)
    (lp_ref * weights).sum().backward()

    cp, me = parallel_state.get_context_parallel_world_size(), parallel_state.get_context_parallel_rank()
    group = parallel_state.get_context_parallel_group()
    width = inputs.shape[1]
    layout = SeqLayout(width, cp, "zigzag")
    columns = layout.position_list(me)
    positions = torch.tensor([c if c < width else -1 for c in columns])[None].expand(shape[0], -1)
    valid = torch.tensor([c < width for c in columns])
    x = layout.shard(inputs, me, dim=1, pad_value=0)
    y = layout.shard(targets, me, dim=1, pad_value=0)
    w = layout.shard(weights, me, dim=1, pad_value=0.0)
    lp = token_logprobs(mlm(x, positions), y)
    (lp * w * valid).sum().backward()
    for p in mlm.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
    grid = torch.zeros(shape[0], layout.padded_len, dtype=lp.dtype)
    grid[:, [c for c in columns]] = lp.detach()
    dist.all_reduce(grid, group=group)
    grads = hybrid_grads(mlm)
    expected = {n: p.grad for n, p in ref.named_parameters()}
    return {
        "logprobs": compare(grid[:, :width], lp_ref.detach(), dtype),
        "grads": {n: compare(grads[n], g, dtype) for n, g in expected.items()},
        "missing_grads": sorted(set(expected) - set(grads)),
        "calls": sorted({(c.layer_type, c.strategy) for c in mlm.ledger.calls}),
    }


def cp_parity_job(
    ctx, cfg: ModelConfig, tp: int, cp: int, shape: tuple[int, int] = (2, 11), policy: str = "fp32"
) -> dict:
    """``cp_parity`` on a gloo rank of a pool of ``tp * cp`` ranks."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, context_parallel_size=cp)
    try:
        return cp_parity(cfg, shape=shape, policy=policy)
    finally:
        parallel_state.destroy_model_parallel()
