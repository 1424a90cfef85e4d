"""MoE layers under the megatron engine: megatron's MoELayer equals ringzero's MoE on identical fp32 weights
(per-token log-probs, every gradient, router and each expert's included, and which experts every token
picks), at TP = 1 in this process and TP = 2 on two gloo ranks; the weight conversion (router, routing
bias, each expert, shared experts, TP shards) converts back exactly; what megatron cannot express is
refused at build. Measured on 2 x 16 tokens: log-probs within 2e-6, gradients within 7e-5 (abs), all 32
tokens route identically in both MoE layers, all 4 experts used."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron_kit import parity, parity_job, random_hybrid, tiny_moe_config  # noqa: E402

from ringzero.engines.megatron.convert import from_megatron, to_megatron  # noqa: E402
from ringzero.errors import RingzeroError  # noqa: E402
from ringzero.model.config import PrecisionPolicy  # noqa: E402
from ringzero.model.routing import capture_routing  # noqa: E402

FP32 = PrecisionPolicy.model_validate("fp32")
SHAPE = (2, 16)  # [B, S]: 32 tokens per MoE layer


def _assert_parity(report: dict) -> None:
    assert report["logprobs"]["ok"], report["logprobs"]
    assert not report["missing_grads"]
    bad = {n: (r["max_abs"], r["max_rel"]) for n, r in report["grads"].items() if not r["ok"]}
    assert not bad, f"gradients past the fp32 tolerance: {bad}"
    moe = [n for n in report["grads"] if ".mlp.gate." in n or ".mlp.experts." in n or ".shared_experts." in n]
    assert len(moe) == 2 * (1 + 4 * 3 + 3), f"not every MoE gradient was compared: {moe}"
    assert report["state_round_trip"], "hybrid_state(MegatronLM) differs from the weights loaded"
    assert sorted(report["routing"]) == [1, 2]  # layer 0 is dense (first_k_dense_replace: 1)
    for layer, r in report["routing"].items():
        assert r["agree"] == r["tokens"] == SHAPE[0] * SHAPE[1], f"layer {layer}: experts differ: {r}"
        assert r["experts_used"] == r["experts"], f"layer {layer}: an expert got no token, untested: {r}"


def test_routing_biases_steer_the_choice():
    """The parity below is about non-trivial routing: the random biases change some tokens' experts."""
    torch.set_num_threads(1)
    cfg = tiny_moe_config()
    model = random_hybrid(cfg, FP32)
    ids = torch.randint(0, cfg.vocab_size, SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), capture_routing(model) as biased:
        model(ids)
    for name, buf in model.named_buffers():
        if name.endswith("expert_bias"):
            buf.zero_()
    with torch.no_grad(), capture_routing(model) as plain:
        model(ids)
    changed = sum(int((biased[i].sort(-1).values != plain[i].sort(-1).values).any(-1).sum()) for i in biased)
    assert changed > 0


@pytest.mark.parametrize("tie", [False, True])
def test_tp1_equals_hybrid(one_rank, tie):
    _assert_parity(parity(tiny_moe_config(tie=tie), shape=SHAPE))


@pytest.mark.distributed
@pytest.mark.slow
def test_tp2_equals_hybrid(two_ranks):
    for report in two_ranks.run(parity_job, tiny_moe_config(), 2, SHAPE):
        _assert_parity(report)


@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_is_exact(tp):
    cfg = tiny_moe_config()
    state = random_hybrid(cfg, FP32).state_dict()
    shards = [to_megatron(state, cfg, r, tp) for r in range(tp)]
    back = from_megatron(shards, cfg)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], v) for k, v in state.items())
    if tp == 2:
        # expert 3's gated fc1 on rank 1: its gate rows, then its up rows; the router and its bias whole
        gate, up = (
            state["layers.1.mlp.experts.3.gate_proj.weight"],
            state["layers.1.mlp.experts.3.up_proj.weight"],
        )
        n = gate.shape[0] // 2
        assert torch.equal(
            shards[1]["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"],
            torch.cat([gate[n:], up[n:]]),
        )
        assert torch.equal(
            shards[1]["decoder.layers.1.mlp.router.expert_bias"], state["layers.1.mlp.gate.expert_bias"]
        )
        assert torch.equal(
            shards[1]["decoder.layers.2.mlp.shared_experts.linear_fc2.weight"],
            state["layers.2.mlp.shared_experts.down_proj.weight"].chunk(2, dim=1)[1],
        )


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"norm_topk_prob": False}, "norm_topk_prob is false"),
        ({"num_experts": 8, "num_experts_per_tok": 4}, "num_experts_per_tok // model.topk_group is 4"),
    ],
)
def test_what_megatron_cannot_express_is_refused_at_build(one_rank, change, expected):
    from ringzero.engines.megatron.model import MegatronLM

    cfg = tiny_moe_config().model_copy(update=change)
    with pytest.raises(RingzeroError, match="cannot build MegatronLM") as info:
        MegatronLM(cfg, FP32)
    assert expected in str(info.value)
