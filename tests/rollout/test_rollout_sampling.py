"""Sampling on hand-made logits: the kept sets of top-k/top-p, frequencies, greedy rows, per-row streams."""

from __future__ import annotations

import pytest
import torch

from ringzero.rollout.engine.sampling import (
    UNIFORM_BLOCK,
    RowSettings,
    UniformStream,
    inverse_cdf,
    sample_next,
    sample_seed,
)

# Probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02 and one token that can never be drawn.
PROBS = torch.tensor([0.25, 0.05, 0.4, 0.0, 0.1, 0.02, 0.15, 0.03], dtype=torch.float64)
LOGITS = PROBS.clamp(min=1e-300).log()


def _draw(rows: int, *, temperature=1.0, top_k=0, top_p=1.0):
    settings = RowSettings.build([temperature] * rows, [top_k] * rows, [top_p] * rows)
    return sample_next(LOGITS.expand(rows, -1).float(), settings, UniformStream(range(rows)).next())


@pytest.mark.parametrize(
    "top_k,top_p,kept",
    [
        (3, 1.0, [2, 0, 6]),  # the three most likely
        (0, 0.7, [2, 0, 6]),  # 0.4 + 0.25 < 0.7, so the token crossing 0.7 stays too
        (0, 0.62, [2, 0]),  # 0.4 + 0.25 passes 0.62: nothing more needed
        (2, 0.9, [2, 0]),  # the intersection of both sets
        (0, 1.0, [2, 0, 6, 4, 1, 7, 5]),
    ],
)
def test_only_kept_tokens_are_drawn_in_renormalised_proportions(top_k, top_p, kept):
    n = 6000
    tokens, logprobs = _draw(n, top_k=top_k, top_p=top_p)
    counts = torch.bincount(tokens, minlength=8).double()
    assert set(torch.nonzero(counts)[:, 0].tolist()) == set(kept)
    want = torch.zeros(8, dtype=torch.float64)
    want[kept] = PROBS[kept] / PROBS[kept].sum()
    sigma = (want * (1 - want) / n).sqrt()
    assert bool(((counts / n - want).abs() <= 5 * sigma + 1e-12).all())
    # The reported log-prob is the unfiltered one, whatever was cut.
    torch.testing.assert_close(logprobs.double(), PROBS.log()[tokens], atol=1e-6, rtol=0)


def test_temperature_scales_before_the_log_softmax():
    tokens, logprobs = _draw(2000, temperature=0.5)
    want = torch.log_softmax(LOGITS.float() / 0.5, -1).double()
    torch.testing.assert_close(logprobs.double(), want[tokens], atol=1e-5, rtol=0)
    assert float((tokens == 2).double().mean()) > 0.5  # sharper than T = 1 (0.4 there)


def test_greedy_rows_take_the_argmax_next_to_sampling_rows():
    settings = RowSettings.build([0.0, 1.0, 0.0, 1.0] * 50, [0] * 200, [1.0] * 200)
    tokens, logprobs = sample_next(LOGITS.expand(200, -1), settings, UniformStream(range(200)).next())
    assert tokens[0::2].unique().tolist() == [2]
    assert len(tokens[1::2].unique()) > 2
    torch.testing.assert_close(logprobs[0::2], PROBS.log()[2].expand(100))


def test_inverse_cdf_never_returns_a_zero_probability_token():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    for u in (0.0, 0.5, 1.0 - 1e-17, 1.0):
        idx = inverse_cdf(probs, torch.tensor([u, u], dtype=torch.float64))
        assert bool((probs.gather(-1, idx[:, None]) > 0).all()), u


def test_a_rows_uniforms_survive_dropping_and_repeating_other_rows():
    stream = UniformStream([11, 22, 33])
    first = [stream.next() for _ in range(5)]
    stream.select([2, 2], torch.tensor([2, 2]))
    later = torch.stack([stream.next() for _ in range(UNIFORM_BLOCK + 3)])
    alone = UniformStream([33])
    expected = torch.stack([alone.next() for _ in range(UNIFORM_BLOCK + 8)])[:, 0]
    assert torch.equal(torch.stack(first)[:, 2], expected[:5])
    # The repeated row continues its own stream; both copies then share one generator, which is why the
    # engine gives every sample its own seed instead of repeating rows after decoding started.
    assert torch.equal(later[: UNIFORM_BLOCK - 5, 0], expected[5:UNIFORM_BLOCK])


def test_sample_seeds_are_distinct_and_stable():
    seeds = {sample_seed(s, k) for s in range(50) for k in range(8)}
    assert len(seeds) == 400 and all(0 <= x < 2**63 for x in seeds)
    # Pinned values, not f(x) == f(x) in one process: a change of the mix (or a dependence on the hash seed
    # or the Python version) would silently change every seeded rollout of a resumed run.
    assert (sample_seed(7, 3), sample_seed(0, 1), sample_seed(2**40, 5)) == (
        6018027440424182934,
        1,
        5367187945662971909,
    )


def test_host_flags_follow_a_selection_with_the_device_tensors():
    settings = RowSettings.build([0.0, 1.0, 0.5], [0, 3, 0], [1.0, 1.0, 0.9])
    kept = settings.select([2, 0, 2], torch.tensor([2, 0, 2]))
    assert kept.greedy == (False, True, False) and kept.filters == (True, False, True)
    assert kept.filters_B.tolist() == list(kept.filters)
    assert (kept.temperature_B == 0).tolist() == list(kept.greedy)
