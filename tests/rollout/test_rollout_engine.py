"""The embedded engine: batching, the log-prob convention, seeds, n samples, policies, refusals."""

from __future__ import annotations

import pytest
import torch
from rollout_kit import assert_close, policy, prompts, requests, tiny_model

from ringzero.errors import RingzeroError
from ringzero.model.logprobs import token_logprobs
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, RolloutClient, SamplingParams
from ringzero.tokenizer import CharTokenizer

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def _teacher_forced(model, completion, temperature):
    """log_softmax(logits / T) of each output token from one parallel forward over the whole sequence."""
    seq = torch.tensor([completion.prompt_ids + completion.output_ids])
    with torch.no_grad():
        logits = model(seq)[:, len(completion.prompt_ids) - 1 : -1]
    return logits, token_logprobs(logits, seq[:, len(completion.prompt_ids) :], temperature)[0]


@pytest.mark.parametrize("body", ["float64", "float32"])
def test_batched_greedy_equals_one_by_one(body):
    model = tiny_model(body)
    batch = prompts([9, 2, 14, 5, 1, 11])
    stop_id = 29  # a stop id some rows hit early: dropped rows must not disturb the others
    engine = EmbeddedEngine(model, policy=policy(body), max_batch=4, prefill_chunk=3)
    together = engine.generate(requests(batch, max_new_tokens=12, temperature=0, stop_token_ids=(stop_id,)))
    alone_engine = EmbeddedEngine(model, policy=policy(body))
    lengths = set()
    for prompt, (got,) in zip(batch, together, strict=True):
        ((want,),) = alone_engine.generate(
            requests([prompt], max_new_tokens=12, temperature=0, stop_token_ids=(stop_id,))
        )
        assert got.output_ids == want.output_ids and got.finish_reason == want.finish_reason
        assert_close(got.output_logprobs, want.output_logprobs, DTYPES[body])
        lengths.add(len(got.output_ids))
    assert len(lengths) > 1, "rows should finish at different steps for this test to mean anything"


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, 0.9), (1.3, 0, 1.0), (0, 0, 1.0)])
def test_logprobs_are_full_vocab_log_softmax_before_filtering(temperature, top_k, top_p):
    model = tiny_model("float64")
    engine = EmbeddedEngine(model, policy=policy("float64"))
    outs = engine.generate(
        requests(
            prompts([6, 3]), max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p, seed=3
        )
    )
    renormalised_differs = False
    for (c,) in outs:
        logits, want = _teacher_forced(model, c, temperature if temperature > 0 else 1.0)
        assert_close(c.output_logprobs, want, torch.float64)
        if top_k:
            # Renormalising over the kept set would raise every log-prob; the reported ones are not raised.
            kept_mass = torch.softmax(logits[0] / temperature, -1).topk(top_k, -1).values.sum(-1)
            renormalised = want - kept_mass.log()
            renormalised_differs |= bool((renormalised - torch.tensor(c.output_logprobs)).abs().min() > 1e-3)
    assert renormalised_differs or not top_k


def test_greedy_picks_the_argmax_of_the_teacher_forced_logits():
    model = tiny_model("float64")
    ((c,),) = EmbeddedEngine(model).generate(requests(prompts([7]), max_new_tokens=15, temperature=0))
    logits, _ = _teacher_forced(model, c, 1.0)
    assert c.output_ids == logits[0].argmax(-1).tolist()


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6), (4, 0.5)])
def test_sampled_tokens_stay_inside_top_k_and_top_p(top_k, top_p):
    model = tiny_model("float64")
    engine = EmbeddedEngine(model)
    outs = engine.generate(
        requests(prompts([5, 8, 3, 6]), max_new_tokens=20, temperature=1.0, top_k=top_k, top_p=top_p, n=4)
    )
    seen_ranks = set()
    for group in outs:
        for c in group:
            logits, _ = _teacher_forced(model, c, 1.0)
            probs = torch.softmax(logits[0], -1)
            sorted_p, order = probs.sort(-1, descending=True)
            ranks = (order == torch.tensor(c.output_ids)[:, None]).int().argmax(-1)
            mass_before = (sorted_p.cumsum(-1) - sorted_p).gather(-1, ranks[:, None])[:, 0]
            if top_k:
                assert int(ranks.max()) < top_k
            assert bool((mass_before <= top_p).all())
            seen_ranks.update(ranks.tolist())
    assert len(seen_ranks) > 1, "sampling should not collapse to greedy"


def test_seeded_request_is_independent_of_batch_composition():
    model = tiny_model("float64")
    probe = GenerateRequest(prompts([6])[0], SamplingParams(max_new_tokens=16, top_p=0.95, seed=1234))
    alone = EmbeddedEngine(model).generate([probe])[0][0]
    others = requests(prompts([11, 2, 7], seed=5), max_new_tokens=9, temperature=0.8)
    crowded = EmbeddedEngine(model, max_batch=3, seed=99).generate([others[0], probe, *others[1:]])[1][0]
    assert crowded.output_ids == alone.output_ids
    assert_close(crowded.output_logprobs, alone.output_logprobs, torch.float64)
    reseeded = EmbeddedEngine(model).generate(
        [GenerateRequest(probe.input_ids, SamplingParams(max_new_tokens=16, top_p=0.95, seed=1235))]
    )[0][0]
    assert reseeded.output_ids != alone.output_ids


@pytest.mark.parametrize("neighbour", [{"top_k": 5}, {"top_p": 0.5}, {}])
def test_unfiltered_seeded_request_ignores_its_neighbours_filters(neighbour):
    model = tiny_model("float64")
    probe = GenerateRequest(prompts([6])[0], SamplingParams(max_new_tokens=16, seed=77))
    alone = EmbeddedEngine(model).generate([probe])[0][0]
    other = requests(prompts([9], seed=3), max_new_tokens=4, **neighbour)[0]
    beside = EmbeddedEngine(model).generate([other, probe])[1][0]
    assert beside.output_ids == alone.output_ids


def test_unseeded_requests_follow_the_engine_seed():
    model = tiny_model("float64")
    batch = requests(prompts([4, 4]), max_new_tokens=12)
    first = EmbeddedEngine(model, seed=1).generate(batch)
    again = EmbeddedEngine(model, seed=1).generate(batch)
    other = EmbeddedEngine(model, seed=2).generate(batch)
    ids = lambda outs: [c.output_ids for g in outs for c in g]  # noqa: E731
    assert ids(first) == ids(again) and ids(first) != ids(other)


def test_n_samples_share_a_prefill_and_differ():
    model = tiny_model("float64")
    reqs = [
        GenerateRequest(prompts([5])[0], SamplingParams(max_new_tokens=10, n=5, seed=7)),
        GenerateRequest(prompts([9], seed=1)[0], SamplingParams(max_new_tokens=6, n=2, temperature=0)),
    ]
    outs = EmbeddedEngine(model, max_batch=4).generate(reqs)  # a request's samples split across groups
    assert [len(g) for g in outs] == [5, 2]
    assert len({tuple(c.output_ids) for c in outs[0]}) == 5
    assert all(c.prompt_ids == reqs[0].input_ids for c in outs[0])
    greedy_alone = EmbeddedEngine(model).generate(
        requests([reqs[1].input_ids], max_new_tokens=6, temperature=0)
    )
    assert [c.output_ids for c in outs[1]] == [greedy_alone[0][0].output_ids] * 2
    for c in outs[0]:  # every fanned-out row decodes from the right cache
        assert_close(c.output_logprobs, _teacher_forced(model, c, 1.0)[1], torch.float64)


def test_engine_runs_its_own_policy_on_its_own_copy():
    model = tiny_model("float32")
    engine = EmbeddedEngine(model, policy=policy("fp32-islands"))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert engine.model.policy == policy("fp32-islands") and engine.model is not model
    ((c,),) = engine.generate(requests(prompts([5]), max_new_tokens=4))
    assert len(c.output_logprobs) == 4 and all(lp <= 0 for lp in c.output_logprobs)


def test_protocol_records_and_length_cap():
    model = tiny_model("float64")
    engine: RolloutClient = EmbeddedEngine(model, CharTokenizer(), weight_version="v3")
    assert engine.health() is True
    ((c,),) = engine.generate(
        [GenerateRequest(prompts([60])[0], SamplingParams(max_new_tokens=30), rid="r1")]
    )
    assert (
        c.finish_reason == "length" and len(c.output_ids) == 4
    )  # max_position_embeddings 64 leaves 4 tokens
    assert c.weight_version == "v3" and c.meta == {"rid": "r1"} and c.matched_stop is None


@pytest.mark.parametrize(
    "prompt,params,match",
    [
        ([], SamplingParams(), "empty"),
        ([5, 64], SamplingParams(), "outside the vocabulary"),
        ([3] * 64, SamplingParams(), "no room"),
        ([5], SamplingParams(stop=("ab",)), "need a tokenizer"),
    ],
)
def test_bad_requests_are_refused(prompt, params, match):
    with pytest.raises(RingzeroError, match=match):
        EmbeddedEngine(tiny_model("float64")).generate([GenerateRequest(prompt, params)])
