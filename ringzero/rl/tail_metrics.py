"""Per-step metrics that expose the train/rollout gap by its tail, plus rollout summaries.

Peers log the mean (sometimes min/max after truncation) of the importance ratio; a loss spike with no
algorithmic cause lives in the tail, so this module logs the raw distribution over masked tokens:

- ``ratio/*``: |r - 1| (mean, p50, p90, p99, p99.9, max), ``ratio/above_clip_frac`` (r > 1 + eps_high),
  ``ratio/nonfinite_frac`` (tokens whose log-probs were not finite; left out of the distributions);
- ``logratio/*``: |log r|, the same statistics;
- ``drift/pos_A-B/{mean,p99}``: |log r| by response position (0-based, both ends included), since the gap compounds along a trajectory;
- ``entropy/*``, ``kl/*``, ``len/*``, ``reward/*``, ``trace/*``: what the policy did.

Pure functions of tensors and lists; the ratio here is the raw one (no clamp), as the engines produced it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ringzero.metrics import distribution
from ringzero.rl.losses.kl import k3

DEFAULT_BUCKET = 64
LENGTH_PERCENTILE = 95


def _masked_values(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> np.ndarray:
    """The masked values on the host: one read of each tensor (they are logged), masked there."""
    values = np.asarray(x_NT.detach().double().tolist(), dtype=np.float64).reshape(tuple(x_NT.shape))
    return values[np.asarray(mask_NT.bool().tolist(), dtype=bool).reshape(tuple(mask_NT.shape))]


def position_buckets(buckets: int | Sequence[int], length: int) -> list[tuple[str, int, int]]:
    """``[(label, start, end_exclusive)]`` covering positions ``0..length-1``.

    An int is a bucket width (labels ``0-63``, ``64-127``: the same keys whatever the batch's length);
    a sequence lists bucket starts beginning at 0, the last bucket open-ended (``256+``).
    """
    if isinstance(buckets, int):
        if buckets < 1:
            raise ValueError(f"bucket width must be >= 1 (got {buckets})")
        return [(f"{s}-{s + buckets - 1}", s, s + buckets) for s in range(0, length, buckets)]
    starts = list(buckets)
    if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:], strict=False)):
        raise ValueError(f"bucket starts must begin at 0 and increase (got {starts})")
    ends = starts[1:] + [max(length, starts[-1])]
    labels = [f"{a}-{b - 1}" for a, b in zip(starts, starts[1:], strict=False)] + [f"{starts[-1]}+"]
    return list(zip(labels, starts, ends, strict=True))


def ratio_tail(logp_train_NT: torch.Tensor, logp_rollout_NT: torch.Tensor, mask_NT: torch.Tensor, *,
               eps_high: float, buckets: int | Sequence[int] = DEFAULT_BUCKET) -> dict[str, float]:
    mask_NT = mask_NT.bool()
    log_r_NT = (logp_train_NT.detach() - logp_rollout_NT.detach()).double()
    finite_NT = torch.isfinite(log_r_NT)
    valid_NT = mask_NT & finite_NT
    n_masked = int(mask_NT.sum())
    abs_log_r_NT = log_r_NT.abs()
    r_NT = log_r_NT.exp()
    out = {
        **distribution("ratio", _masked_values((r_NT - 1).abs(), valid_NT)),
        **distribution("logratio", _masked_values(abs_log_r_NT, valid_NT)),
        "ratio/above_clip_frac": float(((r_NT > 1 + eps_high) & valid_NT).sum()) / n_masked if n_masked else 0.0,
        "ratio/nonfinite_frac": float((mask_NT & ~finite_NT).sum()) / n_masked if n_masked else 0.0,
    }
    positions_T = torch.arange(log_r_NT.shape[1], device=log_r_NT.device)
    for label, start, end in position_buckets(buckets, log_r_NT.shape[1]):
        in_bucket_NT = valid_NT & ((positions_T >= start) & (positions_T < end))[None, :]
        values = _masked_values(abs_log_r_NT, in_bucket_NT)
        if values.size:  # a bucket no response reached has no drift to report
            out[f"drift/pos_{label}/mean"] = float(values.mean())
            out[f"drift/pos_{label}/p99"] = float(np.quantile(values, 0.99))
    return out


def entropy_summary(entropy_NT: torch.Tensor, mask_NT: torch.Tensor) -> dict[str, float]:
    """Per-token policy entropy (nats) over masked tokens."""
    return distribution("entropy", _masked_values(entropy_NT, mask_NT.bool()))


def kl_summary(logp_train_NT: torch.Tensor, logp_ref_NT: torch.Tensor, mask_NT: torch.Tensor) -> dict[str, float]:
    """Per-token k3 KL to the reference over masked tokens."""
    mask_NT = mask_NT.bool()
    with torch.no_grad():
        return distribution("kl", _masked_values(k3(logp_train_NT, logp_ref_NT, mask_NT), mask_NT))


def length_summary(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """Response lengths in tokens; ``truncated`` marks responses cut by max_new_tokens, not by a stop."""
    if len(lengths) != len(truncated):
        raise ValueError(f"{len(lengths)} lengths but {len(truncated)} truncation flags")
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.size == 0:
        return {k: float("nan") for k in ("len/mean", f"len/p{LENGTH_PERCENTILE}", "len/max", "len/trunc_rate")}
    return {
        "len/mean": float(arr.mean()),
        f"len/p{LENGTH_PERCENTILE}": float(np.percentile(arr, LENGTH_PERCENTILE)),
        "len/max": float(arr.max()),
        "len/trunc_rate": float(np.mean(np.asarray(truncated, dtype=bool))),
    }


def reward_summary(rewards: Sequence[float], group_size: int | None = None) -> dict[str, float]:
    """Mean and spread of rewards; with ``group_size``, the share of groups whose rewards are all equal
    (they give zero advantage, so no policy gradient) and the share with at least one full reward."""
    arr = np.asarray(rewards, dtype=np.float64)
    out = {"reward/mean": float(arr.mean()) if arr.size else float("nan"),
           "reward/std": float(arr.std()) if arr.size else float("nan")}
    if group_size is not None and arr.size:
        if arr.size % group_size:
            raise ValueError(f"group_size {group_size} must divide the number of rewards {arr.size}")
        groups = arr.reshape(-1, group_size)
        out["reward/zero_std_groups"] = float(np.mean(groups.max(axis=1) == groups.min(axis=1)))
        out["reward/solved_groups"] = float(np.mean(groups.max(axis=1) >= 1.0))
    return out


def trace_summary(uses_trace: Sequence[bool], rewards: Sequence[float],
                  step_checks: Sequence[tuple[int, int]] | None = None) -> dict[str, float]:
    """``trace/rate``: share of responses that open a worked trace; accuracy of each route (NaN when a
    route was not taken); with ``step_checks`` ((steps, correct) per response), the share of steps that hold."""
    used = np.asarray(uses_trace, dtype=bool)
    r = np.asarray(rewards, dtype=np.float64)
    if used.shape != r.shape:
        raise ValueError(f"{used.size} trace flags but {r.size} rewards")
    out = {
        "trace/rate": float(used.mean()) if used.size else float("nan"),
        "trace/accuracy": float(r[used].mean()) if used.any() else float("nan"),
        "trace/direct_accuracy": float(r[~used].mean()) if (~used).any() else float("nan"),
    }
    if step_checks is not None:
        steps = sum(s for s, _ in step_checks)
        out["trace/step_accuracy"] = sum(c for _, c in step_checks) / steps if steps else float("nan")
    return out
