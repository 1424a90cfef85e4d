"""One comparison for "this layout (or engine) trains like the reference": the layout tests in
tests/parallel and the engine tests in tests/engines share it, so the two cannot drift apart.

Every listed step metric must be present on both sides (a metric one side lacks is a failure, never a
skip), and RL must have moved its weights away from its own start: layouts that never stepped would
otherwise agree."""

from __future__ import annotations

import math

import torch

from ringzero.model.tolerances import compare

MIN_RL_MOVE = 1e-6
"""The largest weight change RL must make from its own initial weights for the comparison to mean anything."""


def rl_moved(run: dict) -> float:
    """Largest |RL weights - RL's initial weights| over the tensors both hold."""
    return max(
        float((run["rl_weights"][k] - run["rl_init"][k]).abs().max())
        for k in run["rl_weights"]
        if k in run["rl_init"]
    )


def assert_same(ref: dict, got: dict, label: str, step_keys: tuple[str, ...]) -> None:
    assert rl_moved(ref) > MIN_RL_MOVE, (
        f"{label}: the reference's RL did not move its weights ({rl_moved(ref):.3g})"
    )
    for step, (a, b) in enumerate(zip(ref["pretrain_losses"], got["pretrain_losses"], strict=True)):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (
            f"{label}: pretrain loss at step {step}: {a} vs {b}"
        )
    assert ref["pretrained"].keys() == got["pretrained"].keys(), f"{label}: pretrained tensors differ by name"
    for name, value in ref["pretrained"].items():
        check = compare(got["pretrained"][name], value, torch.float32)
        assert check["ok"], f"{label}: pretrained {name}: {check}"
    for step, (a, b) in enumerate(zip(ref["rl_steps"], got["rl_steps"], strict=True)):
        assert a["output_ids"] == b["output_ids"], f"{label}: RL step {step} sampled different tokens"
        for key in step_keys:
            missing = [side for side, m in (("reference", a), ("layout", b)) if key not in m["metrics"]]
            assert not missing, f"{label}: RL step {step}: {key} missing on the {' and '.join(missing)}"
            x, y = a["metrics"][key], b["metrics"][key]
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5), (
                f"{label}: RL step {step} {key}: {x} vs {y}"
            )
    missing = sorted(set(ref["rl_weights"]) - set(got["rl_weights"]))
    assert not missing, f"{label}: RL weights missing from the layout: {missing}"
    for name, value in ref["rl_weights"].items():
        check = compare(got["rl_weights"][name], value, torch.float32)
        assert check["ok"], f"{label}: RL weights {name}: {check}"
