"""``tolerances.compare``, the check behind ``check decode`` / ``check cp`` and the layout tests: a shape
mismatch or an empty comparison is an error, never a pass."""

import pytest
import torch

from ringzero.model.tolerances import compare


def test_equal_tensors_pass_and_a_miss_fails():
    x = torch.linspace(-1, 1, 16)
    assert compare(x, x.clone(), torch.float32)["ok"]
    report = compare(x + 1e-3, x, torch.float32)
    assert not report["ok"] and report["max_abs"] == pytest.approx(1e-3, rel=1e-3)


def test_a_column_against_a_row_is_refused_not_broadcast():
    x = torch.zeros(4)
    # [4, 1] - [4] broadcasts to [4, 4], all zeros: a pass without the shape check
    with pytest.raises(ValueError, match=r"shapes differ, actual \(4, 1\) vs expected \(4,\)"):
        compare(x[:, None], x, torch.float32)


def test_empty_tensors_prove_nothing():
    with pytest.raises(ValueError, match="empty tensors"):
        compare(torch.empty(0, 3), torch.empty(0, 3), torch.float64)


def test_a_non_finite_actual_fails():
    x = torch.ones(3)
    assert not compare(torch.tensor([1.0, float("nan"), 1.0]), x, torch.float32)["ok"]
