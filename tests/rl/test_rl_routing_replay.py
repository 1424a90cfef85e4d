"""Routing replay: the trainer rescores with the experts the rollout engine reported for each token."""

from __future__ import annotations

import pytest
import torch

from ringzero.config.loader import load_config
from ringzero.config.stages import LossSettings
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import capture_routing, replay_routing
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.trainer import PolicyTrainer

MOE = ModelConfig(
    vocab_size=32,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=6,
    kv_lora_rank=8,
    intermediate_size=40,
    group_norm_size=2,
    num_experts=6,
    n_group=3,
    topk_group=2,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    first_k_dense_replace=1,
)


def _model():
    return random_weights_(HybridLM(MOE, PrecisionPolicy.preset("fp64")), torch.Generator().manual_seed(0))


def _engine_experts(model, seq):
    """What an engine reports: [len(seq) - 1, layers, K], -1 on dense layers."""
    with capture_routing(model) as chosen:
        model(torch.tensor([seq[:-1]]))
    out = torch.full((len(seq) - 1, MOE.num_hidden_layers, MOE.num_experts_per_tok), -1, dtype=torch.int32)
    for layer, ids in chosen.items():
        out[:, layer] = ids[0].to(torch.int32)
    return out


def _batch(model, experts_of=None):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 32, (n,), generator=g).tolist() for n in (3, 5, 4)]
    outputs = [torch.randint(3, 32, (n,), generator=g).tolist() for n in (4, 2, 5)]
    T = max(len(o) for o in outputs)
    experts = [(experts_of or _engine_experts)(model, p + o) for p, o in zip(prompts, outputs, strict=True)]
    mask = torch.tensor([[j < len(o) for j in range(T)] for o in outputs])
    return RolloutBatch(
        problems=[None] * 3,
        prompt_ids=prompts,
        output_ids=outputs,
        responses=[""] * 3,
        logp_rollout_NT=torch.zeros(3, T, dtype=torch.float64),
        mask_NT=mask,
        rewards_N=torch.zeros(3),
        correct=[False] * 3,
        truncated=[False] * 3,
        uses_trace=[False] * 3,
        group_size=1,
        routed_experts=experts,
    ), T


def _trainer(model, replay: bool, T: int):
    return PolicyTrainer(
        model,
        None,
        LossSettings(routing_replay=replay),
        minibatches=1,
        max_new_tokens=T,
        temperature=1.0,
        micro_batch=16,
    )


def test_replaying_the_models_own_routing_changes_nothing():
    model = _model()
    batch, T = _batch(model)
    with_replay = _trainer(model, True, T).score(model, batch, [0, 1, 2], T)[0]
    without = _trainer(model, False, T).score(model, batch, [0, 1, 2], T)[0]
    # Response tokens only: padding past a row's end is routed to expert 0 under replay (no loss reads it).
    # Not bitwise: the reported slot order of a token's experts can differ from this batch's, and the
    # weighted sum then adds in another order (fp64 rounding).
    torch.testing.assert_close(with_replay[batch.mask_NT], without[batch.mask_NT], rtol=1e-12, atol=1e-12)


def test_replay_forces_the_reported_experts_for_every_token():
    model = _model()

    def shifted(m, seq):  # an engine that routed differently: every expert id moved by one
        own = _engine_experts(m, seq)
        return torch.where(own >= 0, (own + 1) % MOE.num_experts, own)

    batch, T = _batch(model, shifted)
    got = _trainer(model, True, T).score(model, batch, [0, 1, 2], T)[0]
    plain = _trainer(model, False, T).score(model, batch, [0, 1, 2], T)[0]
    for i, (p, o) in enumerate(zip(batch.prompt_ids, batch.output_ids, strict=True)):
        seq = p + o
        forced = {layer: batch.routed_experts[i][:, layer].long()[None] for layer in (1, 2, 3)}
        with replay_routing(model, forced):
            logits = model(torch.tensor([seq[:-1]]))
        want = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]
        torch.testing.assert_close(got[i, : len(o)], want[len(p) - 1 :], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(got[i, : len(o)], plain[i, : len(o)])


def test_replay_needs_moe_layers_and_is_refused_with_deterministic():
    """The run config refuses both at load; the trainer trusts it."""
    with pytest.raises(Exception, match=r"routing_replay: precision.deterministic already makes"):
        load_config(
            "configs/tiny-cpu.yaml",
            ["stages.stage1.loss.routing_replay=true", "precision.deterministic=true"],
        )
    with pytest.raises(Exception, match=r"loss.routing_replay: the model has no MoE layers"):
        load_config("configs/tiny-cpu.yaml", ["stages.stage1.loss.routing_replay=true"])
