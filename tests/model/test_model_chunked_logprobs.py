"""``chunked_token_logprobs``: the LM head and log-softmax over chunks of positions give the unchunked
values and gradients, and never hold (nor save for backward) a whole ``[B*S, V]`` tensor."""

from __future__ import annotations

import pytest
import torch
from model_kit import policy, randomize, tiny_cfg
from model_tolerances import assert_close
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import MemoryProfileTimeline

from ringzero.errors import RingzeroError
from ringzero.model import scoring
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import chunked_token_logprobs, entropy, token_logprobs

F64, F32 = torch.float64, torch.float32


def _setup(gen, body: str, vocab: int = 96, B: int = 3, S: int = 37):
    model = randomize(HybridLM(tiny_cfg(vocab_size=vocab), policy(body)))
    hidden = torch.randn(B, S, 32, generator=gen, dtype=F64).to(model.word_embeddings.weight.dtype)
    targets = torch.randint(0, vocab, (B, S), generator=gen)
    return model, hidden.requires_grad_(True), targets


def _grads(model, hidden, value):
    params = [model.norm.weight, model.head_weight]
    return torch.autograd.grad(value, [hidden, *params])


@pytest.mark.parametrize("chunk", [1, 7, 10, 64, 111, 4096])  # N = 3 * 37 = 111
@pytest.mark.parametrize("body,dtype", [("float64", F64), ("float32", F32)])
def test_values_and_gradients_equal_the_unchunked_reference(gen, chunk, body, dtype):
    model, hidden, targets = _setup(gen, body)
    w_BS = torch.randn(targets.shape, generator=gen, dtype=dtype)  # a loss that weights every position
    ref = token_logprobs(model.logits(hidden), targets, 0.7)
    ref_grads = _grads(model, hidden, (ref * w_BS).sum())
    logp, ent = chunked_token_logprobs(model.logits, hidden, targets, 0.7, chunk_tokens=chunk)
    assert ent is None and logp.dtype == ref.dtype == dtype and logp.shape == targets.shape
    assert_close(logp, ref)
    for got, want in zip(_grads(model, hidden, (logp * w_BS).sum()), ref_grads, strict=True):
        assert_close(got, want)
    if chunk >= targets.numel():
        assert torch.equal(logp, ref)  # one chunk is the unchunked call itself


@pytest.mark.parametrize("chunk", [8, 50, 500])
def test_entropy_without_gradient(gen, chunk):
    model, hidden, targets = _setup(gen, "float64")
    logits = model.logits(hidden)
    logp, ent = chunked_token_logprobs(
        model.logits, hidden, targets, 1.3, chunk_tokens=chunk, with_entropy=True
    )
    assert_close(ent, entropy(logits, 1.3))
    assert_close(logp, token_logprobs(logits, targets, 1.3))
    assert logp.requires_grad and not ent.requires_grad


def test_bf16_body_gives_fp32_under_the_lm_head_island(gen):
    model, hidden, targets = _setup(gen, "bfloat16")
    logp, ent = chunked_token_logprobs(model.logits, hidden, targets, chunk_tokens=16, with_entropy=True)
    assert logp.dtype == ent.dtype == F32
    assert_close(logp, token_logprobs(model.logits(hidden), targets), F32)


def test_no_grad_mode(gen):
    model, hidden, targets = _setup(gen, "float64")
    with torch.no_grad():
        logp, _ = chunked_token_logprobs(model.logits, hidden, targets, chunk_tokens=10)
        ref = token_logprobs(model.logits(hidden), targets)
    assert not logp.requires_grad
    assert_close(logp, ref)


def test_bad_inputs_are_refused(gen):
    model, hidden, targets = _setup(gen, "float64")
    with pytest.raises(RingzeroError, match="temperature"):
        chunked_token_logprobs(model.logits, hidden, targets, temperature=0.0)
    with pytest.raises(RingzeroError, match="chunk_tokens"):
        chunked_token_logprobs(model.logits, hidden, targets, chunk_tokens=0)
    with pytest.raises(RingzeroError, match="do not match"):
        chunked_token_logprobs(model.logits, hidden, targets[:, :-1])


def _largest_saved(fn) -> int:
    """Elements of the largest tensor autograd saves for backward while ``fn`` runs."""
    largest = 0

    def pack(t):
        nonlocal largest
        largest = max(largest, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return largest


def test_no_saved_tensor_spans_all_positions_times_vocab(gen):
    V, B, S, chunk = 512, 4, 150, 64
    model, hidden, targets = _setup(gen, "float32", vocab=V, B=B, S=S)
    unchunked = _largest_saved(lambda: token_logprobs(model.logits(hidden), targets))
    chunked = _largest_saved(
        lambda: chunked_token_logprobs(model.logits, hidden, targets, chunk_tokens=chunk)
    )
    assert unchunked >= B * S * V  # the probe sees the whole log-softmax when it is saved
    assert chunked < B * S * V / 4 and chunked <= max(chunk * V, V * 32)


def _peak_bytes(fn) -> int:
    """Peak live tensor bytes over the profiler's memory timeline while ``fn`` runs (forward + backward)."""
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        fn()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    return int(max(sum(s) for s in sizes))


def test_peak_memory_is_one_chunk_not_the_whole_sequence(gen):
    V, B, S, chunk = 2048, 2, 1024, 128
    model, hidden, targets = _setup(gen, "float32", vocab=V, B=B, S=S)
    full_logits = B * S * V * 4

    def step(chunked: bool):
        def run():
            if chunked:
                logp, _ = chunked_token_logprobs(model.logits, hidden, targets, chunk_tokens=chunk)
            else:
                logp = token_logprobs(model.logits(hidden), targets)
            logp.sum().backward()

        return run

    peak_full = _peak_bytes(step(False))
    peak_chunked = _peak_bytes(step(True))
    assert peak_full > 2 * full_logits  # logits and log-softmax of every position, at least
    assert peak_chunked < full_logits / 2, (peak_chunked, full_logits)


@pytest.mark.parametrize("chunk", [scoring.SCORE_CHUNK_TOKENS, 5])
def test_scoring_numerator_is_unchanged(gen, monkeypatch, chunk):
    """``score_sequences`` (the importance ratio's numerator) equals the unchunked computation: bitwise
    when the batch fits one chunk, within fp32 tolerance otherwise; gradients too."""
    monkeypatch.setattr(scoring, "SCORE_CHUNK_TOKENS", chunk)
    model = randomize(HybridLM(tiny_cfg(), policy("float32")))
    seqs = [torch.randint(1, 64, (n,), generator=gen).tolist() for n in (9, 14, 6)]
    plens = [3, 5, 2]
    got = scoring.score_sequences(model, seqs, plens, temperature=0.8)
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
    first = min(plens) - 1
    ref = token_logprobs(model.logits(model.hidden(ids[:, :-1])[:, first:]), ids[:, first + 1 :], 0.8)
    for r, (s, p) in enumerate(zip(seqs, plens, strict=True)):
        want = ref[r, p - 1 - first : len(s) - 1 - first]
        if chunk == scoring.SCORE_CHUNK_TOKENS:
            assert torch.equal(got[r], want)
        else:
            assert_close(got[r], want)
    params = list(model.parameters())
    g_got = torch.autograd.grad(sum(t.sum() for t in got), params)
    g_ref = torch.autograd.grad(
        sum(
            ref[r, p - 1 - first : len(s) - 1 - first].sum()
            for r, (s, p) in enumerate(zip(seqs, plens, strict=True))
        ),
        params,
    )
    for a, b in zip(g_got, g_ref, strict=True):
        assert_close(a, b)
