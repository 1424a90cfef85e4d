"""The train/rollout gap in miniature: each eval checkpoint's own samples scored under rollout precisions.

The tiny CPU run trains and samples in fp32, so its RL steps never show the gap the paper is about. The
eval stage shows it without generating anything more: the responses it already sampled are scored,
teacher-forced with ``score_sequences`` at the sampling temperature, by the fp32 trainer (the checkpoint
under ``precision.train``) and by the same weights copied under each rollout policy of
``EvalStage.gap_policies``; per token ``log r = logp_train - logp_policy``.

Both sides run the same padded, micro-batched forward over the same sequences, so the only difference is
the policy's dtypes: decoding vs the parallel form (``eval/ratio/*``) is left out, and a policy equal to
the train one gives exactly 0 (the negative control). Per policy the values are ``eval/gap/<policy>/``
``ratio/p99`` and ``ratio/max`` (of ``|r - 1|`` over all tokens) and ``seq_abs_log_ratio`` (mean over
responses of ``|sum of the response's log r|``: the gap compounded along one trajectory), then the same
three per third of the responses ranked by length (``short``, ``mid``, ``long``; see ``length_thirds``):
runaway length should inflate the long third, distillation shrink it, FP32 islands shrink all of it.

Tokens with a non-finite log-prob on either side are left out, as ``ringzero.rollout.engine.gap`` does.

Cost: three scoring passes (trainer and two policies). On the tiny config's model, 512 responses of ~100
tokens took 12 s on one CPU thread (8 s on two) per checkpoint, so ``EvalStage.gap_max_responses``
(default 256: samples 0 and 2 of each of 128 prompts, ~25k tokens, enough for a p99 and ~85 responses a
third) halves it.
Letter legend: n tokens of one response.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ringzero.config.stages import EvalStage
from ringzero.model.config import PrecisionPolicy
from ringzero.model.scoring import score_sequences
from ringzero.model.weights import copy_under_policy
from ringzero.rl.rollout_batch import RolloutBatch

THIRDS = ("short", "mid", "long")


def length_thirds(lengths: Sequence[int]) -> list[np.ndarray]:
    """Indices of the short, mid and long thirds of responses ranked by length.

    Ties keep batch order (a stable sort), so the split is deterministic. Counts are equal when
    ``len(lengths)`` divides by 3; otherwise they differ by one and the shorter thirds take the extra.
    """
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    return np.array_split(order, len(THIRDS))


def _tail(log_r: Sequence[np.ndarray]) -> dict[str, float]:
    if not log_r:
        return {}
    ratio = np.abs(np.expm1(np.concatenate(log_r)))
    return {
        "ratio/p99": float(np.quantile(ratio, 0.99)) if ratio.size else math.nan,
        "ratio/max": float(ratio.max()) if ratio.size else math.nan,
        "seq_abs_log_ratio": float(np.mean([abs(r.sum()) for r in log_r])),
    }


def gap_values(
    logp_train: Sequence[torch.Tensor], logp_policy: Sequence[torch.Tensor], prefix: str
) -> dict[str, float]:
    """``{prefix}/ratio/p99``, ``/ratio/max``, ``/seq_abs_log_ratio``, and each under ``{prefix}/<third>/``.

    One ``[n]`` tensor pair per response (computed in fp64); a response's length is its ``n``.
    """
    log_r = []
    for a, b in zip(logp_train, logp_policy, strict=True):
        d_n = (
            torch.as_tensor(a).detach().double().cpu() - torch.as_tensor(b).detach().double().cpu()
        ).numpy()
        log_r.append(d_n[np.isfinite(d_n)])
    out = {f"{prefix}/{k}": v for k, v in _tail(log_r).items()}
    for third, idx in zip(THIRDS, length_thirds([len(a) for a in logp_train]), strict=True):
        out.update({f"{prefix}/{third}/{k}": v for k, v in _tail([log_r[i] for i in idx]).items()})
    return out


def scored_rows(batch: RolloutBatch, max_responses: int | None) -> list[int]:
    """The non-empty responses, thinned to every k-th (k = ceil(count / max_responses)) above the cap.

    Responses sit grouped by prompt, so a stride keeps the prompts' spread; the thirds rank this subset.
    """
    rows = [i for i in range(len(batch)) if batch.lengths[i] > 0]
    if max_responses is not None and len(rows) > max_responses:
        rows = rows[:: math.ceil(len(rows) / max_responses)]
    return rows


def policy_gaps(model, batch: RolloutBatch, stage: EvalStage) -> dict[str, float]:
    """``gap_values`` of ``model`` (the trainer, under its own policy) against its copy under each of
    ``stage.gap_policies``, on ``batch``'s sampled responses; empty without policies or responses."""
    rows = scored_rows(batch, stage.gap_max_responses)
    if not stage.gap_policies or not rows:
        return {}
    sequences, prompt_lens = batch.sequences(rows)

    def score(m) -> list[torch.Tensor]:
        return score_sequences(m, sequences, prompt_lens, stage.sampling.temperature)

    out: dict[str, float] = {}
    with torch.no_grad():
        logp_train = score(model)
        for name in stage.gap_policies:
            rollout = copy_under_policy(model, PrecisionPolicy.preset(name)).eval()
            out.update(gap_values(logp_train, score(rollout), f"eval/gap/{name}"))
            del rollout  # one copy at a time
    return out
