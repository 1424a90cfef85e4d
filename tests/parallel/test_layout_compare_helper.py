"""The shared layout comparison itself (tests/layout_compare.py): it passes equal runs and fails the
ways a layout or engine test must fail, without any ranks."""

from __future__ import annotations

import copy

import pytest
import torch
from layout_compare import assert_same


def run() -> dict:
    w0 = torch.zeros(3)
    return {
        "pretrain_losses": [2.0, 1.5],
        "pretrained": {"w": torch.ones(3)},
        "rl_init": {"w": w0},
        "rl_weights": {"w": w0 + 0.01},
        "rl_steps": [{"output_ids": [[1, 2]], "metrics": {"loss/total": 0.5, "ratio/p99": 0.01}}],
    }


KEYS = ("loss/total", "ratio/p99")


def test_equal_runs_pass():
    assert_same(run(), run(), "same", KEYS)


def test_a_metric_missing_on_either_side_fails_instead_of_being_skipped():
    got = run()
    del got["rl_steps"][0]["metrics"]["ratio/p99"]
    with pytest.raises(AssertionError, match="ratio/p99 missing on the layout"):
        assert_same(run(), got, "layout", KEYS)
    with pytest.raises(AssertionError, match="ratio/p99 missing on the reference"):
        assert_same(got, run(), "layout", KEYS)


def test_a_reference_whose_rl_never_stepped_fails_even_when_both_sides_agree():
    still = run()
    still["rl_weights"] = copy.deepcopy(still["rl_init"])
    with pytest.raises(AssertionError, match="did not move its weights"):
        assert_same(still, copy.deepcopy(still), "layout", KEYS)


def test_a_different_metric_value_or_weight_fails():
    got = run()
    got["rl_steps"][0]["metrics"]["loss/total"] = 0.6
    with pytest.raises(AssertionError, match="loss/total"):
        assert_same(run(), got, "layout", KEYS)
    got = run()
    got["rl_weights"]["w"] = got["rl_weights"]["w"] + 1e-3
    with pytest.raises(AssertionError, match="RL weights w"):
        assert_same(run(), got, "layout", KEYS)
