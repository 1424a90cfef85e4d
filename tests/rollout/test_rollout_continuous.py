"""Continuous batching: rows that join a running batch or leave it early give what they give alone."""

from __future__ import annotations

import pytest
import torch
from rollout_kit import assert_close, prompts, tiny_model

from ringzero.errors import RingzeroError
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.engine.sampling import UNIFORM_BLOCK, UniformStream
from ringzero.rollout.types import GenerateRequest, LogprobRequest, SamplingParams

STOP_ID = 29  # some rows hit it early, so rows leave at different steps


def mixed_requests(count: int, seed: int = 1) -> list[GenerateRequest]:
    """Greedy, seeded-sampled and filtered rows of different prompt and output lengths."""
    settings = [dict(temperature=0), dict(temperature=0.9), dict(temperature=1.2, top_p=0.9), dict(top_k=6)]
    return [
        GenerateRequest(
            p,
            SamplingParams(
                max_new_tokens=6 + 5 * (i % 4),
                seed=100 + i,
                stop_token_ids=(STOP_ID,),
                **settings[i % len(settings)],
            ),
        )
        for i, p in enumerate(prompts([3 + (7 * i) % 17 for i in range(count)], seed=seed))
    ]


def run_arrivals(batch, arrivals: dict[int, list[GenerateRequest]]):
    """Admit ``arrivals[step]`` before decoding step ``step``; the completions of every request, in order."""
    order, out, step = {}, {}, 0
    flat = [r for step_reqs in arrivals.values() for r in step_reqs]
    while len(out) < len(flat):
        for r in arrivals.get(step, []):
            order[batch.admit([r])] = len(order)
        batch.step()
        for job_id, (group,) in batch.finished():
            out[order[job_id]] = group
        step += 1
    return [out[i] for i in range(len(flat))]


def alone(engine: EmbeddedEngine, reqs):
    return [engine.generate([r])[0] for r in reqs]


def assert_same_tokens(got, want, dtype=torch.float64):
    for g, w in zip(got, want, strict=True):
        assert [c.output_ids for c in g] == [c.output_ids for c in w]
        assert [c.finish_reason for c in g] == [c.finish_reason for c in w]
        for a, b in zip(g, w, strict=True):
            assert_close(a.output_logprobs, b.output_logprobs, dtype)


@pytest.mark.parametrize("compact_below", [0.0, 0.5, 1.0])
def test_rows_joining_mid_decode_get_what_they_get_alone(compact_below):
    engine = EmbeddedEngine(tiny_model("float64"), compact_below=compact_below)
    reqs = mixed_requests(8)
    arrivals = {0: reqs[:2], 2: reqs[2:4], 3: [reqs[4]], 7: reqs[5:7], 9: [reqs[7]]}
    batch = engine.open_batch()
    got = run_arrivals(batch, arrivals)
    assert_same_tokens(got, alone(engine, reqs))
    assert len({len(g[0].output_ids) for g in got}) > 2, "rows should leave at different steps"
    assert (batch.compactions == 0) == (compact_below == 0.0)
    assert batch.cache is None and batch.live == 0  # an empty batch holds no cache


def test_n_seeded_samples_joining_late_share_a_prefill_and_match_alone():
    engine = EmbeddedEngine(tiny_model("float64"))
    late = GenerateRequest(prompts([12], seed=4)[0], SamplingParams(max_new_tokens=10, n=3, seed=7))
    batch = engine.open_batch()
    first = batch.admit(mixed_requests(2))
    for _ in range(3):
        batch.step()
    second = batch.admit([late])
    answers = {}
    while len(answers) < 2:
        batch.step()
        answers.update(batch.finished())
    assert_same_tokens(answers[second], engine.generate([late]))
    assert_same_tokens(answers[first], engine.generate(mixed_requests(2)))


def test_finished_rows_free_their_slots_for_newcomers_without_growing_the_cache():
    engine = EmbeddedEngine(tiny_model("float64"), compact_below=0.0)
    long_req = GenerateRequest(prompts([5], seed=2)[0], SamplingParams(max_new_tokens=40, temperature=0))
    shorts = [
        GenerateRequest(p, SamplingParams(max_new_tokens=3, seed=i))
        for i, p in enumerate(prompts([4, 9, 2, 13, 6, 8], seed=3))
    ]
    batch = engine.open_batch()
    batch.admit([long_req, shorts[0]])
    slots_seen = set()
    answers = {}
    for short in shorts[1:]:
        while batch.live > 1:  # wait for the previous short one to leave
            batch.step()
        answers.update(batch.finished())
        batch.admit([short])
        slots_seen.add(batch.slots)
    while batch.live:
        batch.step()
    answers.update(batch.finished())
    assert slots_seen == {2}, "each newcomer takes the slot the last one left"
    assert batch.compactions == 0
    assert_same_tokens([g for j in sorted(answers) for g in answers[j]], alone(engine, [long_req, *shorts]))


def test_compaction_rewrites_the_cache_down_to_live_rows():
    engine = EmbeddedEngine(tiny_model("float64"), compact_below=0.5)
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=2 if i else 20, temperature=0))
        for i, p in enumerate(prompts([3, 4, 5, 6], seed=5))
    ]
    batch = engine.open_batch()
    batch.admit(reqs)
    while batch.live > 1:
        batch.step()
    assert (batch.slots, batch.compactions) == (1, 1)  # one live row of four slots: below half


def test_aborted_rows_end_with_the_next_token_and_the_rest_go_on():
    engine = EmbeddedEngine(tiny_model("float64"))
    reqs = [
        GenerateRequest(p, SamplingParams(max_new_tokens=12, seed=3 + i))
        for i, p in enumerate(prompts([4, 7]))
    ]
    batch = engine.open_batch()
    job = batch.admit(reqs)
    for _ in range(4):
        batch.step()
    batch.abort(job, {1})
    while not (answered := batch.finished()):
        batch.step()
    ((_, (kept, cut)),) = answered
    assert len(cut[0].output_ids) == 5 and cut[0].finish_reason == "abort"
    assert cut[0].meta["message"] == "Aborted"
    assert_same_tokens([kept], [engine.generate([reqs[0]])[0]])


def test_prompt_only_requests_are_answered_at_admission_with_their_logprobs():
    engine = EmbeddedEngine(tiny_model("float64"))
    req = GenerateRequest(
        prompts([9])[0], SamplingParams(max_new_tokens=0), logprobs=LogprobRequest(prompt_from=0)
    )
    batch = engine.open_batch()
    batch.admit([req])
    ((_, ((got,),)),) = batch.finished()
    (want,) = engine.generate([req])[0]
    assert got.output_ids == [] and got.finish_reason == "length"
    assert_close(got.prompt_logprobs[1:], want.prompt_logprobs[1:], torch.float64)


def test_a_bad_request_is_refused_at_admission_and_the_batch_goes_on():
    engine = EmbeddedEngine(tiny_model("float64"))
    batch = engine.open_batch()
    good = mixed_requests(1)
    job = batch.admit(good)
    batch.step()
    with pytest.raises(RingzeroError, match="outside the vocabulary"):
        batch.admit([GenerateRequest([999], SamplingParams(max_new_tokens=3))])
    answers = {}
    while job not in answers:
        batch.step()
        answers.update(batch.finished())
    assert_same_tokens(answers[job], engine.generate(good))


def test_what_continuous_batches_do_not_track_stays_on_generate():
    engine = EmbeddedEngine(tiny_model("float64"))
    plain = GenerateRequest([5, 6], SamplingParams(max_new_tokens=3))
    assert engine.continuous_ok([plain])
    assert not engine.continuous_ok([plain, GenerateRequest([5], logprobs=LogprobRequest(top_k=2))])
    assert not EmbeddedEngine(tiny_model("float64"), deterministic=True).continuous_ok([plain])


def test_a_uniform_stream_row_joining_mid_block_draws_its_own_stream():
    stream = UniformStream([1, 2])
    early = [stream.next() for _ in range(UNIFORM_BLOCK - 3)]
    stream.join([3])
    joined = [stream.next() for _ in range(UNIFORM_BLOCK + 5)]
    solo = UniformStream([3])
    assert torch.equal(
        torch.stack(joined)[:, 2], torch.stack([solo.next()[0] for _ in range(UNIFORM_BLOCK + 5)])
    )
    row0 = UniformStream([1])
    assert torch.equal(
        torch.cat([torch.stack(early)[:, 0], torch.stack(joined)[:, 0]]),
        torch.stack([row0.next()[0] for _ in range(2 * UNIFORM_BLOCK + 2)]),
    )
