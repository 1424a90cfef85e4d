"""Tail metrics: the ratio distribution, drift by position, and rollout summaries."""

import math

import numpy as np
import pytest
import torch

from ringzero.metrics import MemoryMetricWriter, distribution
from ringzero.rl import tail_metrics
from ringzero.rl.tail_metrics import (
    QUANTILES,
    entropy_summary,
    kl_summary,
    length_reward_summary,
    length_summary,
    position_buckets,
    quantiles,
    ratio_tail,
    reward_summary,
    tail_distribution,
    trace_summary,
)

LOG_R = [0.0, 0.1, -0.2, 0.5, -1.0, 0.05]  # 6 masked tokens in a [2, 4] batch; the rest is padding


def batch():
    rollout = torch.full((2, 4), -1.0)
    log_r = torch.tensor([[0.0, 0.1, -0.2, 0.5], [-1.0, 0.05, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    return rollout + log_r, rollout, mask


def test_ratio_and_logratio_distributions_over_masked_tokens():
    train, rollout, mask = batch()
    out = ratio_tail(train, rollout, mask, eps_high=0.28)
    abs_r = np.abs(np.exp(LOG_R) - 1)
    assert out["ratio/mean"] == pytest.approx(abs_r.mean(), rel=1e-6)
    assert out["ratio/max"] == pytest.approx(
        abs_r.max(), rel=1e-6
    )  # e^0.5 - 1 = 0.65; the padded 7.0 is ignored
    assert out["ratio/p50"] == pytest.approx(np.quantile(abs_r, 0.5), rel=1e-6)
    assert out["logratio/max"] == pytest.approx(1.0, rel=1e-6)
    assert out["logratio/p99.9"] == pytest.approx(np.quantile(np.abs(LOG_R), 0.999), rel=1e-6)
    assert out["ratio/above_clip_frac"] == pytest.approx(1 / 6)  # only e^0.5 > 1.28
    assert out["ratio/nonfinite_frac"] == 0.0


def test_drift_by_position_bucket():
    train, rollout, mask = batch()
    out = ratio_tail(train, rollout, mask, eps_high=0.28, buckets=2)
    assert out["drift/pos_0-1/mean"] == pytest.approx(np.mean([0.0, 0.1, 1.0, 0.05]), rel=1e-6)
    assert out["drift/pos_2-3/mean"] == pytest.approx(np.mean([0.2, 0.5]), rel=1e-6)
    out = ratio_tail(train, rollout, mask, eps_high=0.28, buckets=[0, 3])
    assert out["drift/pos_3+/mean"] == pytest.approx(0.5, rel=1e-6)
    assert out["drift/pos_0-2/p99"] == pytest.approx(np.quantile([0.0, 0.1, 0.2, 1.0, 0.05], 0.99), rel=1e-6)
    assert not any(k.startswith("drift/pos_64") for k in ratio_tail(train, rollout, mask, eps_high=0.28))


def test_non_finite_log_probs_are_counted_not_averaged():
    train, rollout, mask = batch()
    train[0, 1] = float("-inf")
    out = ratio_tail(train, rollout, mask, eps_high=0.28)
    assert out["ratio/nonfinite_frac"] == pytest.approx(1 / 6)
    assert math.isfinite(out["ratio/mean"]) and out["logratio/max"] == pytest.approx(1.0, rel=1e-6)


def test_position_buckets():
    assert position_buckets(64, 130) == [("0-63", 0, 64), ("64-127", 64, 128), ("128-191", 128, 192)]
    assert position_buckets([0, 16, 64], 300) == [("0-15", 0, 16), ("16-63", 16, 64), ("64+", 64, 300)]
    for bad in (0, [], [1, 5], [0, 5, 5]):
        with pytest.raises(ValueError):
            position_buckets(bad, 10)


def test_entropy_and_kl_summaries():
    _, _, mask = batch()
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0]])
    assert entropy_summary(entropy, mask)["entropy/max"] == 6.0
    assert entropy_summary(entropy, mask)["entropy/mean"] == pytest.approx(3.5)
    cur = torch.zeros(2, 4)
    ref = torch.full((2, 4), math.log(2.0))
    assert kl_summary(cur, ref, mask)["kl/mean"] == pytest.approx(2 - math.log(2) - 1, rel=1e-6)


def test_length_reward_and_trace_summaries():
    lengths = [10, 20, 30, 128]
    out = length_summary(lengths, [False, False, False, True])
    assert out == {
        "len/mean": 47.0,
        "len/p95": pytest.approx(np.percentile(lengths, 95)),
        "len/max": 128.0,
        "len/trunc_rate": 0.25,
    }
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    out = reward_summary(rewards, group_size=2)
    assert out["reward/mean"] == pytest.approx(0.5)
    assert out["reward/zero_std_groups"] == pytest.approx(2 / 3)  # (0, 0) and (1, 1)
    assert out["reward/solved_groups"] == pytest.approx(2 / 3)
    out = trace_summary(
        [True, False, True, False, False, False], rewards, step_checks=[(4, 4), (0, 0), (4, 2)]
    )
    assert out["trace/rate"] == pytest.approx(1 / 3)
    assert out["trace/accuracy"] == pytest.approx(0.5) and out["trace/direct_accuracy"] == pytest.approx(0.5)
    assert out["trace/step_accuracy"] == pytest.approx(6 / 8)
    assert math.isnan(trace_summary([False], [1.0])["trace/accuracy"])
    with pytest.raises(ValueError):
        length_summary([1, 2], [True])


def test_length_against_reward_within_groups():
    # group 1: the long sample is right (r = +1); group 2: the long ones are wrong (r = -1); group 3 all
    # right (no spread in reward: left out of the correlation)
    lengths = [10, 30, 40, 20, 5, 9]
    correct = [0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    out = length_reward_summary(lengths, correct, group_size=2)
    assert out["len/reward_corr"] == pytest.approx(0.0)  # (+1 - 1) / 2
    assert out["len/correct_mean"] == pytest.approx((30 + 20 + 5 + 9) / 4)
    assert out["len/wrong_mean"] == pytest.approx((10 + 40) / 2)
    out = length_reward_summary([10, 30, 12, 20], [0.0, 1.0, 0.0, 1.0], group_size=2)
    assert out["len/reward_corr"] == pytest.approx(1.0)
    allright = length_reward_summary([3, 4], [1.0, 1.0], group_size=2)
    assert math.isnan(allright["len/wrong_mean"]) and math.isnan(allright["len/reward_corr"])
    with pytest.raises(ValueError):
        length_reward_summary([1, 2, 3], [1.0, 0.0, 1.0], group_size=2)


def test_every_key_is_accepted_by_the_metric_writer():
    train, rollout, mask = batch()
    metrics = {
        **ratio_tail(train, rollout, mask, eps_high=0.28),
        **entropy_summary(torch.ones(2, 4), mask),
        **kl_summary(train, rollout, mask),
        **length_summary([3, 4], [False, True]),
        **reward_summary([1.0, 0.0], 2),
        **trace_summary([True, False], [1.0, 0.0]),
    }
    record = MemoryMetricWriter().log(0, metrics)
    assert {
        "ratio/p99",
        "ratio/p99.9",
        "logratio/p99",
        "drift/pos_0-63/mean",
        "len/p95",
        "trace/rate",
    } <= set(record)


def test_percentiles_on_two_to_the_25_values_are_numpys_exactly():
    """torch.quantile refuses more than 2^24 values; the selection here takes 2^25 (32 MiB of float64 x 8)
    and gives numpy's linear-interpolation percentiles bit for bit (same order statistics, same lerp)."""
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(2**25, generator=gen, dtype=torch.float64).abs()
    flat[:1000] = flat[1000]  # ties
    with pytest.raises(RuntimeError):
        torch.quantile(flat, 0.5)
    arr = flat.numpy()
    qs = [*QUANTILES, 0.0, 1.0, 0.25]
    assert quantiles(flat, qs) == np.quantile(arr, qs).tolist()
    assert tail_distribution("ratio", flat) == distribution("ratio", arr)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 4097])
def test_sorted_selection_matches_the_host_selection(n):
    """The accelerator path (one sort, indexed) picks the same order statistics as the host's introselect."""
    gen = torch.Generator().manual_seed(n)
    flat = torch.randint(0, 50, (n,), generator=gen).double() / 7  # many ties
    ks = sorted({0, n - 1, n // 2, (n - 1) * 99 // 100})
    assert tail_metrics._sorted_pick(flat, ks) == tail_metrics._partition_pick(flat, ks)
    assert quantiles(flat, QUANTILES) == np.quantile(flat.numpy(), QUANTILES).tolist()
    if torch.cuda.is_available():
        assert quantiles(flat.cuda(), QUANTILES) == pytest.approx(
            np.quantile(flat.numpy(), QUANTILES), rel=1e-15
        )


def test_empty_and_nan_values():
    assert all(math.isnan(v) for v in quantiles(torch.zeros(0, dtype=torch.float64), QUANTILES))
    assert all(math.isnan(v) for v in tail_distribution("x", torch.zeros(0)).values())
    assert math.isnan(quantiles(torch.tensor([1.0, float("nan")]), [0.5])[0])


def test_ratio_tail_numbers_are_the_numpy_ones():
    """The tail through the tensor path equals the former host path (np.quantile over the masked values)."""
    gen = torch.Generator().manual_seed(1)
    rollout = -torch.rand(8, 200, generator=gen).double() * 3
    train = rollout + 0.1 * torch.randn(8, 200, generator=gen).double()
    mask = torch.rand(8, 200, generator=gen) < 0.8
    out = ratio_tail(train, rollout, mask, eps_high=0.28)
    abs_r = np.abs(np.exp((train - rollout).numpy()) - 1)[mask.numpy()]
    abs_log = np.abs((train - rollout).numpy())[mask.numpy()]
    assert {k: out[k] for k in distribution("ratio", abs_r)} == distribution("ratio", abs_r)
    assert {k: out[k] for k in distribution("logratio", abs_log)} == distribution("logratio", abs_log)
    first = np.abs((train - rollout).numpy()[:, :64])[mask.numpy()[:, :64]]
    assert out["drift/pos_0-63/p99"] == float(np.quantile(first, 0.99))
    assert out["drift/pos_0-63/mean"] == float(first.mean())
