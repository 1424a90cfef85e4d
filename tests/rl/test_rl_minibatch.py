"""A minibatch cut into shards (rows and token columns) adds up to the whole: its loss, gradient and metrics.

Reference: the stage's objective called once over the whole minibatch in float64. The shards are what the
trainer's ranks and micro-batches see: some rows (``rows_at``) and some of their tokens (``owned``).
"""

from __future__ import annotations

import pytest
import torch

from ringzero.config.stages import LossSettings
from ringzero.parallel.runtime import single
from ringzero.rl.corrections.compose import BatchCorrection
from ringzero.rl.minibatch import LossSums, Minibatch, loss_metric_keys
from ringzero.rl.objective import objective
from ringzero.rl.rollout_batch import RolloutBatch

N, T = 6, 9
SETTINGS = [
    LossSettings(),
    LossSettings(normalization="sample_mean", kl_coef=0.1),
    LossSettings(kind="ppo_clip", normalization="token_mean", eps_low=0.2),
]


def _batch(g: torch.Generator) -> RolloutBatch:
    lengths = [9, 4, 1, 7, 6, 3]
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    logp = -torch.rand((N, T), generator=g, dtype=torch.float64) * 3 * mask
    return RolloutBatch(
        problems=[None] * N,
        prompt_ids=[[1]] * N,
        output_ids=[[2] * n for n in lengths],
        responses=[""] * N,
        logp_rollout_NT=logp,
        mask_NT=mask,
        rewards_N=torch.zeros(N),
        correct=[False] * N,
        truncated=[False] * N,
        uses_trace=[False] * N,
        group_size=2,
    )


def _correction(batch: RolloutBatch, g: torch.Generator) -> BatchCorrection:
    keep = batch.mask_NT & (torch.rand((N, T), generator=g) > 0.3)
    weight = torch.rand((N, T), generator=g, dtype=torch.float64) + 0.5
    old = batch.logp_rollout_NT + 0.1 * torch.randn((N, T), generator=g, dtype=torch.float64)
    return BatchCorrection(old, weight, keep, keep.any(dim=1), {})


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: f"{s.kind}-{s.normalization}-kl{s.kl_coef}")
@pytest.mark.parametrize("corrected", [False, True])
def test_shards_add_up_to_the_whole_minibatch(settings, corrected):
    g = torch.Generator().manual_seed(7)
    batch = _batch(g)
    correction = _correction(batch, g) if corrected else None
    rows = [0, 2, 3, 5]
    adv = torch.randn(N, generator=g, dtype=torch.float64)
    logp_MT = batch.logp_rollout_NT[rows] + 0.3 * torch.randn((4, T), generator=g, dtype=torch.float64)
    ref_MT = logp_MT.detach() - 0.2
    mb = Minibatch.cut(batch, rows, adv, correction, settings, max_new_tokens=T)

    whole_in = logp_MT.clone().requires_grad_(True)
    whole = mb.loss(settings, whole_in, torch.ones_like(mb.mask_MT), ref_MT if settings.kl_coef else None)
    whole.loss.backward()

    # two "ranks" own alternate columns, each runs two micro-batches of rows
    sharded_in = logp_MT.clone().requires_grad_(True)
    sums = LossSums(loss_metric_keys(settings), torch.device("cpu"))
    total = 0.0
    for owned_T in (torch.arange(T) % 2 == 0, torch.arange(T) % 2 == 1):
        for at in ([0, 1], [2, 3]):
            part = mb.rows_at(at)
            owned = owned_T.expand(len(at), T)
            ref = ref_MT[at] if settings.kl_coef else None
            out = part.loss(settings, sharded_in[at], owned, ref)
            sums.add(out.metrics)
            total = total + out.loss
    total.backward()
    merged = sums.total(single("cpu"))

    assert total.item() == pytest.approx(whole.loss.item(), rel=1e-12)
    torch.testing.assert_close(sharded_in.grad, whole_in.grad, rtol=1e-12, atol=1e-15)
    assert merged.keys() == whole.metrics.keys()
    for key, want in whole.metrics.items():
        assert merged[key] == pytest.approx(want, rel=1e-9, abs=1e-12), key
    assert merged["loss/tokens"] == float(
        mb.mask_MT.sum() if correction is None else correction.keep_NT[rows].sum()
    )


def test_a_nonfinite_shard_makes_the_whole_minibatch_nonfinite():
    g = torch.Generator().manual_seed(3)
    batch = _batch(g)
    settings = LossSettings()
    mb = Minibatch.cut(batch, [0, 1], torch.ones(N, dtype=torch.float64), None, settings, max_new_tokens=T)
    sums = LossSums(loss_metric_keys(settings), torch.device("cpu"))
    logp = batch.logp_rollout_NT[[0, 1]].clone()
    sums.add(mb.rows_at([0]).loss(settings, logp[:1], torch.ones((1, T), dtype=torch.bool), None).metrics)
    logp[1, 0] = float("nan")
    sums.add(mb.rows_at([1]).loss(settings, logp[1:], torch.ones((1, T), dtype=torch.bool), None).metrics)
    merged = sums.total(single("cpu"))
    assert merged["loss/nonfinite"] == 1.0
    whole = objective(
        settings, logp, batch.logp_rollout_NT[[0, 1]], torch.ones(2), mb.mask_MT, mb.normalization
    )
    assert not whole.finite
