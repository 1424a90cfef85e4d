"""``return_routed_experts``: the engine reports the experts its own forwards chose for every fed token.

Reference: ``capture_routing`` of one teacher-forced parallel forward over ``prompt + output[:-1]``. Under
fp64 the cached decode (left-padded, chunked prefill, fan-out, rows leaving the batch) and the parallel
form agree to ~1e-15, so the chosen experts are identical barring exact ties. Layout as SGLang's
``meta_info["routed_experts"]``: ``[len(prompt) + len(output) - 1, num_hidden_layers, num_experts_per_tok]``
int32, -1 on dense layers (sgl-project/sglang python/sglang/srt/state_capturer/base.py ``get_topk``: rows
``[0, seqlen - 1)``; slime/rollout/sglang_rollout.py reshapes to ``(len(sample.tokens) - 1, num_layers,
moe_router_topk)``).
"""

from __future__ import annotations

import pytest
import torch
from rollout_kit import policy, prompts
from rollout_kit import tiny_model as dense_model

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import capture_routing
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, LogprobRequest, SamplingParams

MOE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=6,
    kv_lora_rank=8,
    intermediate_size=48,
    group_norm_size=2,
    num_experts=6,
    n_group=3,
    topk_group=2,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    first_k_dense_replace=1,
    max_position_embeddings=64,
)
LAYERS, TOPK = 4, 2
STOPS = tuple(range(3, 64, 6))  # about one token in six ends a row: rows finish at different steps


def moe_model(seed: int = 0) -> HybridLM:
    model = HybridLM(ModelConfig(**MOE), policy("float64"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        random_weights_(model, gen)
    return model.eval()


@pytest.fixture(scope="module")
def model() -> HybridLM:
    return moe_model()


def teacher_forced(engine: EmbeddedEngine, prompt: list[int], output: list[int]) -> torch.Tensor:
    """``[len(prompt) + len(output) - 1, L, K]`` int32 of one parallel forward, -1 on dense layers."""
    fed = (prompt + output)[:-1]
    want = torch.full((len(fed), LAYERS, TOPK), -1, dtype=torch.int32)
    if fed:
        with torch.no_grad(), capture_routing(engine.model) as chosen:
            engine.model.hidden(torch.tensor([fed]))
        for layer, experts in chosen.items():
            want[:, layer] = experts[0].to(torch.int32)
    return want


def check(engine, completions) -> None:
    for c in completions:
        assert c.routed_experts is not None
        assert c.routed_experts.dtype == torch.int32 and c.routed_experts.device.type == "cpu"
        assert torch.equal(c.routed_experts, teacher_forced(engine, c.prompt_ids, c.output_ids))
        assert (c.routed_experts[:, 0] == -1).all()  # layer 0 is dense (first_k_dense_replace=1)
        moe = c.routed_experts[:, 1:]
        assert ((moe >= 0) & (moe < 6)).all()
        assert (moe[..., 0] != moe[..., 1]).all()  # two distinct experts per token


def test_batched_rows_samples_chunked_prefill_and_rows_finishing_apart(model):
    # max_batch 4 cuts the 8 rows into two groups; prefill_chunk 3 chunks every prompt but the shortest.
    engine = EmbeddedEngine(model, policy=policy("float64"), max_batch=4, prefill_chunk=3)
    assert engine.routing_shape == (LAYERS, TOPK)
    reqs = [
        GenerateRequest(
            p,
            SamplingParams(max_new_tokens=10, n=n, seed=s, stop_token_ids=STOPS),
            return_routed_experts=True,
        )
        for p, n, s in zip(prompts([2, 7, 5], seed=1), (1, 4, 3), (1, 2, 3), strict=True)
    ]
    out = engine.generate(reqs)
    flat = [c for group in out for c in group]
    assert len({len(c.output_ids) for c in flat}) >= 3  # rows left the batch at different steps
    assert len({tuple(c.output_ids) for c in out[1]}) > 1  # the n samples differ
    check(engine, flat)
    # The fed tokens of the n samples share the prompt's rows (one prefill, fanned out).
    p = len(reqs[1].input_ids)
    assert all(torch.equal(c.routed_experts[:p], out[1][0].routed_experts[:p]) for c in out[1])


def test_rows_that_do_not_ask_get_none_in_the_same_batch(model):
    engine = EmbeddedEngine(model, policy=policy("float64"))
    ps = prompts([3, 6], seed=2)
    out = engine.generate(
        [
            GenerateRequest(ps[0], SamplingParams(max_new_tokens=5, n=2, seed=4)),
            GenerateRequest(ps[1], SamplingParams(max_new_tokens=5, seed=5), return_routed_experts=True),
        ]
    )
    assert [c.routed_experts for c in out[0]] == [None, None]
    check(engine, out[1])
    assert out[1][0].routed_experts.shape == (6 + 5 - 1, LAYERS, TOPK)


def test_the_same_samples_with_and_without_routing(model):
    engine = EmbeddedEngine(model, policy=policy("float64"))
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=6, n=2, seed=9, stop_token_ids=STOPS))
        for p in prompts([4, 2], seed=3)
    ]
    plain = engine.generate(reqs)
    routed = engine.generate(
        [GenerateRequest(r.input_ids, r.params, return_routed_experts=True) for r in reqs]
    )
    assert [[(c.output_ids, c.output_logprobs) for c in g] for g in plain] == [
        [(c.output_ids, c.output_logprobs) for c in g] for g in routed
    ]


def test_prefill_only_and_length_one_rows(model):
    engine = EmbeddedEngine(model, policy=policy("float64"), prefill_chunk=2)
    ps = prompts([5, 1, 1], seed=4)
    out = engine.generate(
        [
            GenerateRequest(
                ps[0],
                SamplingParams(max_new_tokens=0),
                return_routed_experts=True,
                logprobs=LogprobRequest(prompt_from=0),
            ),
            GenerateRequest(ps[1], SamplingParams(max_new_tokens=0), return_routed_experts=True),
            GenerateRequest(ps[2], SamplingParams(max_new_tokens=1, seed=1), return_routed_experts=True),
        ]
    )
    (scored,), (empty,), (one,) = out
    assert scored.routed_experts.shape == (4, LAYERS, TOPK) and scored.prompt_logprobs is not None
    assert empty.routed_experts.shape == (0, LAYERS, TOPK)  # one token, never fed after itself
    assert one.routed_experts.shape == (1, LAYERS, TOPK)  # the prompt token; the sampled one is never fed
    check(engine, [scored, empty, one])


def test_deterministic_mode_reports_the_forwards_it_decoded_with(model):
    engine = EmbeddedEngine(model, policy=policy("float64"), deterministic=True, prefill_chunk=3)
    reqs = [
        GenerateRequest(
            p,
            SamplingParams(max_new_tokens=mx, n=2, seed=6, stop_token_ids=STOPS),
            return_routed_experts=True,
        )
        for p, mx in zip(prompts([3, 6, 1], seed=5), (8, 8, 0), strict=True)
    ]
    out = engine.generate(reqs)
    check(engine, [c for g in out for c in g])
    assert out[2][0].routed_experts.shape == (0, LAYERS, TOPK)


def test_aborted_rows_report_what_was_fed(model):
    engine = EmbeddedEngine(model, policy=policy("float64"), max_batch=2)
    calls = []

    def aborted():
        calls.append(1)
        # Request 0 is aborted after the first group's third step; request 1 (second group) before its
        # prefill.
        return frozenset({0, 1}) if len(calls) > 4 else frozenset()

    ps = prompts([3, 4], seed=6)
    out = engine.generate(
        [
            GenerateRequest(
                ps[0], SamplingParams(max_new_tokens=12, n=2, seed=1), return_routed_experts=True
            ),
            GenerateRequest(ps[1], SamplingParams(max_new_tokens=12, seed=2), return_routed_experts=True),
        ],
        abort=aborted,
    )
    cut = out[0]
    assert all(c.finish_reason == "abort" and 0 < len(c.output_ids) < 12 for c in cut)
    check(engine, cut)
    (queued,) = out[1]
    assert queued.finish_reason == "abort" and queued.output_ids == [] and queued.routed_experts is None


def test_a_dense_model_refuses():
    engine = EmbeddedEngine(dense_model(), policy=policy("float64"))
    assert engine.routing_shape is None
    with pytest.raises(RingzeroError, match="request 0: return_routed_experts needs a model with MoE layers"):
        engine.generate(
            [GenerateRequest([5, 6], SamplingParams(max_new_tokens=2), return_routed_experts=True)]
        )
    ((c,),) = engine.generate([GenerateRequest([5, 6], SamplingParams(max_new_tokens=2))])
    assert c.routed_experts is None
