"""Token log-probs and entropy against plain fp64 arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
from model_tolerances import assert_close

from ringzero.errors import RingzeroError
from ringzero.model.logprobs import entropy, token_logprobs


def _reference_logprob(row, target, temperature):
    z = [float(x) / temperature for x in row]
    m = max(z)
    return z[target] - (m + math.log(sum(math.exp(x - m) for x in z)))


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_logprobs_match_reference(gen, temperature):
    logits = torch.randn(2, 5, 11, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(0, 11, (2, 5), generator=gen)
    got = token_logprobs(logits, targets, temperature)
    want = torch.tensor(
        [
            [_reference_logprob(logits[b, s], int(targets[b, s]), temperature) for s in range(5)]
            for b in range(2)
        ],
        dtype=torch.float64,
    )
    assert_close(got, want)


def test_bf16_logits_give_fp32_logprobs_of_the_same_values(gen):
    logits = (torch.randn(3, 4, 50, generator=gen) * 5).to(torch.bfloat16)
    targets = torch.randint(0, 50, (3, 4), generator=gen)
    got = token_logprobs(logits, targets)
    assert got.dtype == torch.float32
    # The same bf16 values in fp64: only the log-softmax arithmetic differs, at fp32 precision.
    assert_close(got, token_logprobs(logits.double(), targets), torch.float32)


def test_entropy_matches_reference(gen):
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    logits[0, 0, 2] = float("-inf")  # a masked token contributes 0, not NaN
    got = entropy(logits, temperature=0.8)
    for b in range(2):
        for s in range(3):
            p = torch.softmax(logits[b, s] / 0.8, -1)
            want = -sum(float(x) * math.log(float(x)) for x in p if x > 0)
            assert got[b, s].item() == pytest.approx(want, abs=1e-12)


def test_bad_inputs_are_refused(gen):
    logits = torch.randn(2, 3, 7, generator=gen)
    with pytest.raises(RingzeroError, match="temperature must be > 0"):
        token_logprobs(logits, torch.zeros(2, 3, dtype=torch.long), temperature=0.0)
    with pytest.raises(RingzeroError, match="do not match"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
