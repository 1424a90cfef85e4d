"""Layout invariance of the training stages, as torchtitan compares losses across parallel layouts.

The same micro run at (dp, cp) = (1, 1), (2, 1), (1, 2), (2, 2) on CPU gloo ranks must sample the same
rollouts token for token, report the same losses and ratio tail at every step, and end with the same
weights, within the fp32 tolerance helper (the layouts differ only in summation order).
"""

from __future__ import annotations

import pytest
from layout_compare import MIN_RL_MOVE, assert_same, rl_moved
from layout_jobs import run_layout

from ringzero.parallel.launch import RankPool

pytestmark = pytest.mark.xdist_group("layouts")

LAYOUTS = [(2, 1), (1, 2), (2, 2)]
STEP_KEYS = ("loss/total", "ratio/p99", "ratio/max", "reward/mean", "len/mean", "entropy/mean", "grad/norm")


def _run(dp: int, cp: int, tmp_path, pools, **kw) -> dict:
    root = f"file://{tmp_path}/store-{dp}x{cp}-{kw.get('normalization', 'token_sum')}"
    if dp * cp == 1:
        return run_layout(None, 1, 1, root, **kw)
    return pools[dp * cp].run(run_layout, dp, cp, root, **kw)[0]


@pytest.fixture(scope="module")
def pools():
    with RankPool(2, timeout_s=600) as two, RankPool(4, timeout_s=600) as four:
        yield {2: two, 4: four}


def _assert_same(ref: dict, got: dict, label: str) -> None:
    assert_same(ref, got, label, STEP_KEYS)


@pytest.mark.parametrize("normalization,kl_coef", [("token_sum", 0.0), ("sample_mean", 0.05)])
def test_every_layout_trains_like_one_process(normalization, kl_coef, tmp_path, pools):
    ref = _run(1, 1, tmp_path, pools, normalization=normalization, kl_coef=kl_coef)
    assert ref["rl_steps"][0]["metrics"]["loss/total"] != 0.0  # the comparison has something to compare
    assert rl_moved(ref) > MIN_RL_MOVE  # RL really updated, measured from RL's own start
    for dp, cp in LAYOUTS:
        got = _run(dp, cp, tmp_path, pools, normalization=normalization, kl_coef=kl_coef)
        _assert_same(ref, got, f"dp={dp} cp={cp} {normalization}")


def test_the_comparison_catches_a_missing_gradient_sum(tmp_path, pools):
    """Negative control: dp=2 pretraining without the gradient sum over replicas must not pass."""
    ref = _run(1, 1, tmp_path, pools)
    broken = pools[2].run(run_layout, 2, 1, f"file://{tmp_path}/store-broken", skip_grad_sum=True)[0]
    with pytest.raises(AssertionError, match="pretrain"):
        _assert_same(ref, broken, "dp=2 without gradient sum")
