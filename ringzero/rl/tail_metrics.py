"""Per-step metrics that expose the train/rollout gap by its tail, plus rollout summaries.

Peers log the mean (sometimes min/max after truncation) of the importance ratio; a loss spike with no
algorithmic cause lives in the tail, so this module logs the raw distribution over masked tokens:

- ``ratio/*``: |r - 1| (mean, p50, p90, p99, p99.9, max), ``ratio/above_clip_frac`` (r > 1 + eps_high),
  ``ratio/nonfinite_frac`` (tokens whose log-probs were not finite; left out of the distributions);
- ``logratio/*``: |log r|, the same statistics;
- ``drift/pos_A-B/{mean,p99}``: |log r| by response position (0-based, both ends included), since the gap
  compounds along a trajectory;
- ``entropy/*``, ``kl/*``, ``len/*``, ``reward/*``, ``trace/*``: what the policy did.

Pure functions of tensors and lists; the ratio here is the raw one (no clamp), as the engines produced it.

Percentiles are numpy's default (``linear``, method 7: the order statistics at ``floor((n-1)q)`` and the
next, interpolated), found by exact selection where the values live: ``np.partition`` over a view of a host
tensor, one ``torch.sort`` on an accelerator. Neither has ``torch.quantile``'s input limit (2^24 elements: 512
responses of 32k tokens), and no value travels as a Python float; host numbers are np.quantile's, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ringzero.rl.losses.kl import k3

DEFAULT_BUCKET = 64
LENGTH_PERCENTILE = 95
QUANTILES = (0.5, 0.9, 0.99, 0.999)
QUANTILE_NAMES = ("p50", "p90", "p99", "p99.9")


def masked_flat(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    """The masked values as one flat float64 tensor, on the tensor's device.

    On the host a boolean index; elsewhere without a data-dependent shape (a boolean index there is a
    ``nonzero`` whose size the device must report first): masked-out values sort last as +inf and the
    count of kept values, one read, trims them. The result is then sorted, which selection does not mind.
    """
    x, m = x_NT.detach().double(), mask_NT.bool()
    if x.device.type == "cpu":
        return x[m]
    kept = int(m.sum())
    return torch.where(m, x, torch.full_like(x, float("inf"))).reshape(-1).sort().values[:kept]


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's ``_lerp``: the same rounding on either side of t = 0.5."""
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def _partition_pick(flat: torch.Tensor, ks: list[int]) -> list[float]:
    """The order statistics ``ks`` (0-based, ascending) of a host tensor: introselect, as np.quantile."""
    return np.partition(flat.numpy(), ks)[ks].tolist()


def _sorted_pick(flat: torch.Tensor, ks: list[int]) -> list[float]:
    """The same on an accelerator: one sort there, only ``len(ks)`` values read back."""
    return torch.sort(flat).values[torch.tensor(ks, device=flat.device)].tolist()


def quantiles(flat: torch.Tensor, qs: Sequence[float]) -> list[float]:
    """``np.quantile(values, qs)`` (linear interpolation) by exact selection on the values' device."""
    flat = flat.detach().reshape(-1)
    n = flat.numel()
    if n == 0 or bool(torch.isnan(flat).any()):
        return [float("nan")] * len(qs)
    virtual = [(n - 1) * float(q) for q in qs]
    below = [min(max(int(math.floor(v)), 0), n - 1) for v in virtual]
    ks = sorted({*below, *(min(k + 1, n - 1) for k in below)})
    at = dict(
        zip(ks, (_partition_pick if flat.device.type == "cpu" else _sorted_pick)(flat, ks), strict=True)
    )
    return [_lerp(at[k], at[min(k + 1, n - 1)], v - k) for k, v in zip(below, virtual, strict=True)]


def _mean(flat: torch.Tensor) -> float:
    """numpy's pairwise mean on the host (today's numbers, bit for bit), torch's elsewhere."""
    return float(flat.numpy().mean()) if flat.device.type == "cpu" else float(flat.mean())


def tail_distribution(prefix: str, flat: torch.Tensor) -> dict[str, float]:
    """mean, p50, p90, p99, p99.9 and max of a flat tensor under ``prefix/`` (NaN when it is empty)."""
    flat = flat.detach().reshape(-1).double()
    if flat.numel() == 0:
        return {f"{prefix}/{k}": float("nan") for k in ("mean", *QUANTILE_NAMES, "max")}
    top = float(flat.numpy().max()) if flat.device.type == "cpu" else float(flat.max())
    return {
        f"{prefix}/mean": _mean(flat),
        **{f"{prefix}/{name}": v for name, v in zip(QUANTILE_NAMES, quantiles(flat, QUANTILES), strict=True)},
        f"{prefix}/max": top,
    }


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


def ratio_tail(
    logp_train_NT: torch.Tensor,
    logp_rollout_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    eps_high: float,
    buckets: int | Sequence[int] = DEFAULT_BUCKET,
) -> dict[str, float]:
    mask_NT = mask_NT.bool()
    log_r_NT = (logp_train_NT.detach() - logp_rollout_NT.detach()).double()
    finite_NT = torch.isfinite(log_r_NT)
    valid_NT = mask_NT & finite_NT
    n_masked = int(mask_NT.sum())
    abs_log_r_NT = log_r_NT.abs()
    r_NT = log_r_NT.exp()
    out = {
        **tail_distribution("ratio", masked_flat((r_NT - 1).abs(), valid_NT)),
        **tail_distribution("logratio", masked_flat(abs_log_r_NT, valid_NT)),
        "ratio/above_clip_frac": float(((r_NT > 1 + eps_high) & valid_NT).sum()) / n_masked
        if n_masked
        else 0.0,
        "ratio/nonfinite_frac": float((mask_NT & ~finite_NT).sum()) / n_masked if n_masked else 0.0,
    }
    positions_T = torch.arange(log_r_NT.shape[1], device=log_r_NT.device)
    for label, start, end in position_buckets(buckets, log_r_NT.shape[1]):
        in_bucket_NT = valid_NT & ((positions_T >= start) & (positions_T < end))[None, :]
        values = masked_flat(abs_log_r_NT, in_bucket_NT)
        if values.numel():  # a bucket no response reached has no drift to report
            out[f"drift/pos_{label}/mean"] = _mean(values)
            out[f"drift/pos_{label}/p99"] = quantiles(values, [0.99])[0]
    return out


def entropy_summary(entropy_NT: torch.Tensor, mask_NT: torch.Tensor) -> dict[str, float]:
    """Per-token policy entropy (nats) over masked tokens."""
    return tail_distribution("entropy", masked_flat(entropy_NT, mask_NT))


def kl_summary(
    logp_train_NT: torch.Tensor, logp_ref_NT: torch.Tensor, mask_NT: torch.Tensor
) -> dict[str, float]:
    """Per-token k3 KL to the reference over masked tokens."""
    mask_NT = mask_NT.bool()
    with torch.no_grad():
        return tail_distribution("kl", masked_flat(k3(logp_train_NT, logp_ref_NT, mask_NT), mask_NT))


def length_summary(lengths: Sequence[int], truncated: Sequence[bool]) -> dict[str, float]:
    """Response lengths in tokens; ``truncated`` marks responses cut by max_new_tokens, not by a stop."""
    if len(lengths) != len(truncated):
        raise ValueError(f"{len(lengths)} lengths but {len(truncated)} truncation flags")
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.size == 0:
        return {
            k: float("nan") for k in ("len/mean", f"len/p{LENGTH_PERCENTILE}", "len/max", "len/trunc_rate")
        }
    return {
        "len/mean": float(arr.mean()),
        f"len/p{LENGTH_PERCENTILE}": float(np.percentile(arr, LENGTH_PERCENTILE)),
        "len/max": float(arr.max()),
        "len/trunc_rate": float(np.mean(np.asarray(truncated, dtype=bool))),
    }


def length_reward_summary(
    lengths: Sequence[int], correct: Sequence[float], group_size: int
) -> dict[str, float]:
    """Why lengths move: ``len/correct_mean`` and ``len/wrong_mean`` (NaN when no response is correct, or
    none wrong), and ``len/reward_corr``, the Pearson correlation of length and correctness within a
    prompt's group, averaged over the groups where both vary (positive: the longer samples of a prompt are
    the right ones, which is what a group-relative advantage turns into longer responses)."""
    n = np.asarray(lengths, dtype=np.float64)
    c = np.asarray(correct, dtype=np.float64)
    if n.shape != c.shape:
        raise ValueError(f"{n.size} lengths but {c.size} verdicts")
    if n.size % group_size:
        raise ValueError(f"group_size {group_size} must divide the number of responses {n.size}")
    right = c > 0
    corrs = [
        float(np.corrcoef(gn, gc)[0, 1])
        for gn, gc in zip(n.reshape(-1, group_size), c.reshape(-1, group_size), strict=True)
        if gn.std() > 0 and gc.std() > 0
    ]
    return {
        "len/correct_mean": float(n[right].mean()) if right.any() else float("nan"),
        "len/wrong_mean": float(n[~right].mean()) if (~right).any() else float("nan"),
        "len/reward_corr": float(np.mean(corrs)) if corrs else float("nan"),
    }


def reward_summary(
    rewards: Sequence[float], group_size: int | None = None, keep: Sequence[bool] | None = None
) -> dict[str, float]:
    """Mean and spread of rewards; with ``group_size``, the share of groups whose rewards are all equal
    (they give zero advantage, so no policy gradient) and the share with at least one full reward. With
    ``keep`` (the responses a mismatch correction kept), over the kept responses only: a group's shares over
    its kept members, a group with none kept left out."""
    arr = np.asarray(rewards, dtype=np.float64)
    kept = np.ones(arr.size, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    out = {
        "reward/mean": float(arr[kept].mean()) if kept.any() else float("nan"),
        "reward/std": float(arr[kept].std()) if kept.any() else float("nan"),
    }
    if group_size is not None and arr.size:
        if arr.size % group_size:
            raise ValueError(f"group_size {group_size} must divide the number of rewards {arr.size}")
        pairs = zip(arr.reshape(-1, group_size), kept.reshape(-1, group_size), strict=True)
        groups = [g[k] for g, k in pairs if k.any()]
        out["reward/zero_std_groups"] = float(np.mean([g.min() == g.max() for g in groups] or math.nan))
        out["reward/solved_groups"] = float(np.mean([g.max() >= 1.0 for g in groups] or math.nan))
    return out


def trace_summary(
    uses_trace: Sequence[bool], rewards: Sequence[float], step_checks: Sequence[tuple[int, int]] | None = None
) -> dict[str, float]:
    """``trace/rate``: share of responses that open a worked trace; accuracy of each route (NaN when a
    route was not taken); with ``step_checks`` ((steps, correct) per response), the share of steps that
    hold."""
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
