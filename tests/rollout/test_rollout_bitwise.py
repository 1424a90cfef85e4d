"""Deterministic mode samples from the trainer's own distribution and reports its log-probs, bit for bit.

The trainer's numbers come from ``score_tokens`` / ``score_sequences`` with ``batch_invariant=True`` (what
``ringzero.rl.trainer`` calls), on a copy of the weights with autograd on; the sampler is replayed on them
with each row's own seeded uniforms. Normal mode is checked to report the distribution it sampled from,
and a bf16 rollout policy to keep its gap visible.
"""

from __future__ import annotations

import pytest
import torch
from rollout_kit import policy, prompts, tiny_model

import ringzero.rollout.engine.embedded as engine_module
from ringzero.model.scoring import score_sequences, score_tokens
from ringzero.model.weights import copy_under_policy
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.engine.sampling import (
    RowSettings,
    UniformStream,
    sample_from_logprobs,
    sample_seed,
    scaled_logprobs,
)
from ringzero.rollout.types import GenerateRequest, LogprobRequest, SamplingParams

VOCAB = 64


def _mixed() -> list[GenerateRequest]:
    """Plain sampling, top-k, top-p, greedy, a stop id, n samples and varied prompt lengths."""
    ps = prompts([3, 9, 1, 6], seed=4)
    return [
        GenerateRequest(ps[0], SamplingParams(max_new_tokens=14, temperature=0.9, n=2, seed=11)),
        GenerateRequest(ps[1], SamplingParams(max_new_tokens=9, top_k=6, seed=12)),
        GenerateRequest(
            ps[2], SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.8, seed=13, stop_token_ids=(7,))
        ),
        GenerateRequest(ps[3], SamplingParams(max_new_tokens=8, temperature=0, seed=14)),
    ]


def _trainer(master, name: str):
    return copy_under_policy(master, policy(name))  # the trainer's own copy: autograd on, as in training


def _trainer_logprobs_VT(trainer, c, temperature: float) -> torch.Tensor:
    """``[len(output), V]``: the trainer's ``log_softmax(logits / T)`` at each output position (all V
    tokens)."""
    (s,) = score_tokens(
        trainer,
        [c.prompt_ids + c.output_ids],
        [len(c.prompt_ids)],
        temperature,
        batch_invariant=True,
        top_k=VOCAB,
    )
    values, ids = s.top_values.detach(), s.top_ids
    return torch.empty_like(values).scatter_(1, ids, values)  # back to vocabulary order


@pytest.mark.parametrize("preset", ["float32", "bf16"])
def test_deterministic_tokens_resample_from_the_trainers_logits(preset):
    master = tiny_model("float32", seed=3)
    reqs = _mixed()
    out = EmbeddedEngine(master, policy=policy(preset), deterministic=True, max_batch=3).generate(reqs)
    trainer = _trainer(master, preset)
    for req, group in zip(reqs, out, strict=True):
        p = req.params
        for k, c in enumerate(group):
            assert c.output_ids
            logp_TV = _trainer_logprobs_VT(trainer, c, p.temperature)
            settings = RowSettings.build([p.temperature], [p.top_k], [p.top_p])
            uniforms = UniformStream([sample_seed(p.seed, k)])
            for t, token in enumerate(c.output_ids):
                resampled, logp = sample_from_logprobs(logp_TV[t : t + 1], settings, uniforms.next())
                assert int(resampled) == token
                assert float(logp) == c.output_logprobs[t]


def _assert_trainer_equal(master, preset: str) -> None:
    """Every deterministic completion's log-probs are ``torch.equal`` to the trainer's batch-invariant
    scoring."""
    reqs = _mixed()
    completions = [
        c for g in EmbeddedEngine(master, policy=policy(preset), deterministic=True).generate(reqs) for c in g
    ]
    temps = [r.params.temperature for r in reqs for _ in range(r.params.n)]
    trainer = _trainer(master, preset)
    for c, temp in zip(completions, temps, strict=True):
        (train,) = score_sequences(
            trainer, [c.prompt_ids + c.output_ids], [len(c.prompt_ids)], temp, batch_invariant=True
        )
        assert torch.equal(train.detach(), torch.tensor(c.output_logprobs, dtype=train.dtype))


@pytest.mark.parametrize("preset", ["float32", "fp32-islands", "bf16"])
def test_deterministic_logprobs_equal_the_trainers_bit_for_bit(preset):
    _assert_trainer_equal(tiny_model("float32", seed=5), preset)


@pytest.mark.parametrize("preset", ["float32", "bf16"])
def test_deterministic_logprobs_of_a_moe_model_equal_the_trainers_bit_for_bit(preset):
    """MoE experts run on every token in the batch-invariant forward, so no token's bits depend on which
    other tokens chose the same expert."""
    moe = dict(
        num_experts=4,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        first_k_dense_replace=1,
    )
    _assert_trainer_equal(tiny_model("float32", seed=5, **moe), preset)


def test_deterministic_rows_do_not_depend_on_their_batch():
    master, reqs = tiny_model("float32", seed=2), _mixed()
    together = EmbeddedEngine(master, policy=policy("float32"), deterministic=True, max_batch=8).generate(
        reqs
    )
    for req, group in zip(reqs, together, strict=True):
        (alone,) = EmbeddedEngine(master, policy=policy("float32"), deterministic=True, max_batch=1).generate(
            [req]
        )
        assert [c.output_ids for c in alone] == [c.output_ids for c in group]
        assert [c.output_logprobs for c in alone] == [c.output_logprobs for c in group]


def test_deterministic_top_k_and_prompt_logprobs_are_the_trainers():
    master = tiny_model("float32", seed=6)
    req = GenerateRequest(
        prompts([7], seed=3)[0],
        SamplingParams(max_new_tokens=10, temperature=0.8, seed=2),
        logprobs=LogprobRequest(top_k=4, prompt_from=0),
    )
    ((c,),) = EmbeddedEngine(master, policy=policy("float32"), deterministic=True).generate([req])
    trainer = _trainer(master, "float32")
    (out,) = score_tokens(
        trainer, [c.prompt_ids + c.output_ids], [len(c.prompt_ids)], 0.8, batch_invariant=True, top_k=4
    )
    assert [[v for v, _ in pos] for pos in c.output_top_logprobs] == out.top_values.detach().double().tolist()
    assert [[i for _, i in pos] for pos in c.output_top_logprobs] == out.top_ids.tolist()
    (prompt,) = score_tokens(trainer, [c.prompt_ids], [1], 1.0, batch_invariant=True, top_k=4)
    assert c.prompt_logprobs == [None, *prompt.logprobs.detach().double().tolist()]


def test_deterministic_abort_ends_rows_with_what_was_sampled():
    master, calls = tiny_model("float32", seed=1), []

    def aborted():
        calls.append(1)
        return frozenset({0}) if len(calls) > 3 else frozenset()

    reqs = [GenerateRequest(p, SamplingParams(max_new_tokens=12, seed=3)) for p in prompts([4, 5], seed=1)]
    cut, kept = EmbeddedEngine(master, policy=policy("float32"), deterministic=True).generate(
        reqs, abort=aborted
    )
    assert cut[0].finish_reason == "abort" and 0 < len(cut[0].output_ids) < 12
    assert kept[0].finish_reason == "length" and len(kept[0].output_ids) == 12


def test_normal_mode_reports_the_distribution_it_sampled_from(monkeypatch):
    seen = []
    real = engine_module.sample_next

    def recording(logits_BV, rows, u_B):
        tokens_B, logp_B = real(logits_BV, rows, u_B)
        seen.append((scaled_logprobs(logits_BV, rows.temperature_B), tokens_B, logp_B))
        return tokens_B, logp_B

    monkeypatch.setattr(engine_module, "sample_next", recording)
    master = tiny_model("float32", seed=4)
    req = GenerateRequest(prompts([5], seed=2)[0], SamplingParams(max_new_tokens=9, temperature=0.9, seed=8))
    ((c,),) = EmbeddedEngine(master, policy=policy("float32"), max_batch=1).generate([req])
    assert len(seen) == len(c.output_ids)
    for (logp_BV, tokens_B, logp_B), token, reported in zip(
        seen, c.output_ids, c.output_logprobs, strict=True
    ):
        assert int(tokens_B[0]) == token
        assert float(logp_B[0]) == reported == float(logp_BV[0, token])


def test_a_bf16_rollout_in_normal_mode_keeps_its_gap():
    master, reqs = tiny_model("float32", seed=3), _mixed()
    trainer = _trainer(master, "float32")
    plain = [c for g in EmbeddedEngine(master, policy=policy("bf16")).generate(reqs) for c in g]
    temps = [r.params.temperature for r in reqs for _ in range(r.params.n)]
    gaps = []
    for c, temp in zip(plain, temps, strict=True):
        (train,) = score_sequences(
            trainer, [c.prompt_ids + c.output_ids], [len(c.prompt_ids)], temp, batch_invariant=True
        )
        gaps.append(
            float(
                (train.detach().double() - torch.tensor(c.output_logprobs, dtype=torch.float64)).abs().max()
            )
        )
    assert max(gaps) > 1e-4  # bf16 rounding, not last-bit noise
