"""What every loss shares: input checks, the importance ratio, clip and coverage metrics, the output type.

Letter legend: N sequences (responses) in the minibatch, T response positions. ``mask_NT`` is true on
the response tokens that were sampled (padding and prompt are false); values outside it are ignored,
whatever they hold (NaN padding included).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

MAX_LOG_RATIO = 20.0
"""Upper clamp of log r (and of ref - cur in k3) before exp: exp(20) ~ 5e8 keeps r * A finite in fp32.
Beyond it the clamp is flat, so such a token trains no further; the ratio metrics still report it."""


class LossOutput(NamedTuple):
    """``loss`` is a scalar to backpropagate, ``metrics`` namespaced floats.

    When the loss is not finite, ``loss`` is a detached zero and ``metrics["loss/nonfinite"]`` is 1:
    calling ``backward`` on it raises, so a non-finite step cannot reach the weights by accident.
    The caller skips the step and records it (and should still check the gradient norm is finite).
    """

    loss: torch.Tensor
    metrics: dict[str, float]

    @property
    def finite(self) -> bool:
        return self.metrics.get("loss/nonfinite", 0.0) == 0.0


def check_inputs(
    logp_NT: torch.Tensor,
    other_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    advantages_N: torch.Tensor | None = None,
) -> torch.Tensor:
    """Validate shapes; return the mask as bool."""
    if logp_NT.dim() != 2:
        raise ValueError(f"log-probs must be [N, T] (got shape {tuple(logp_NT.shape)})")
    for name, t in (("second log-probs", other_NT), ("mask", mask_NT)):
        if t.shape != logp_NT.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} differs from log-probs {tuple(logp_NT.shape)}")
    if advantages_N is not None and advantages_N.shape != logp_NT.shape[:1]:
        raise ValueError(f"advantages must be [N] = [{logp_NT.shape[0]}] (got {tuple(advantages_N.shape)})")
    return mask_NT.bool()


def masked(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """Zero outside the mask, so NaN or inf padding never enters a sum or a gradient."""
    return torch.where(mask_NT, x_NT, torch.zeros_like(x_NT))


def log_ratio(
    logp_train_NT: torch.Tensor, logp_rollout_NT: torch.Tensor, mask_NT: torch.Tensor
) -> torch.Tensor:
    """log r = train minus rollout log-prob, zero outside the mask, clamped above at ``MAX_LOG_RATIO``.

    At least fp32: the ratio exponentiates a difference of log-probs, and bf16 would round that
    difference to its 8-bit mantissa, which is the very gap the ratio is meant to measure.
    """
    dtype = torch.promote_types(logp_train_NT.dtype, torch.float32)
    diff = masked(logp_train_NT, mask_NT).to(dtype) - masked(logp_rollout_NT, mask_NT).to(dtype)
    return diff.clamp(max=MAX_LOG_RATIO)


def share(flag_NT: torch.Tensor, mask_NT: torch.Tensor) -> float:
    """Share of masked tokens where ``flag`` holds (0 when nothing is masked)."""
    n = int(mask_NT.sum())
    return float((flag_NT & mask_NT).sum()) / n if n else 0.0


def ppo_keeps_gradient(
    ratio_NT: torch.Tensor, adv_NT: torch.Tensor, eps_high: float, eps_low: float
) -> torch.Tensor:
    """Where PPO-clip's gradient survives: -min(rA, clip(r)A) is flat in r when A > 0 and r > 1 + eps_high,
    or A < 0 and r < 1 - eps_low, and everywhere when A = 0."""
    above = (adv_NT > 0) & (ratio_NT > 1 + eps_high)
    below = (adv_NT < 0) & (ratio_NT < 1 - eps_low)
    return (adv_NT != 0) & ~above & ~below


def clip_metrics(
    ratio_NT: torch.Tensor,
    adv_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    coverage_NT: torch.Tensor,
    eps_high: float,
    eps_low: float | None,
    ppo_eps_low: float,
) -> dict[str, float]:
    """Metrics every policy loss reports; ``coverage_NT`` marks tokens with a non-zero gradient under it."""
    return {
        "clip/high_frac": share(ratio_NT > 1 + eps_high, mask_NT),
        "clip/low_frac": share(ratio_NT < 1 - eps_low, mask_NT) if eps_low is not None else 0.0,
        "grad/coverage": share(coverage_NT, mask_NT),
        "grad/ppo_coverage": share(ppo_keeps_gradient(ratio_NT, adv_NT, eps_high, ppo_eps_low), mask_NT),
        "grad/adv_nonzero": share(adv_NT != 0, mask_NT),
    }


def finish(loss: torch.Tensor, metrics: dict[str, float], name: str) -> LossOutput:
    """Record the loss value under ``loss/<name>`` and replace a non-finite loss by a detached zero."""
    value = float(loss.detach())
    finite = torch.isfinite(loss.detach()).item()
    metrics = {f"loss/{name}": value, **metrics, "loss/nonfinite": 0.0 if finite else 1.0}
    return LossOutput(loss if finite else torch.zeros((), dtype=loss.dtype, device=loss.device), metrics)
