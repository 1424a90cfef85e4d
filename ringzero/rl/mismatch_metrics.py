"""How far the training engine's distribution is from the rollout engine's, on the raw ratio.

``r = exp(logp_train - logp_rollout)`` per response token, before any correction (no clamp, no mask of
outliers: what the corrections see, not what they leave). Tokens whose log-probs are not finite are left
out (``ratio/nonfinite_frac`` counts them); a sequence's weight is ``w = prod_t r_t`` over its kept tokens.
The samples come from the rollout engine, so these estimate divergences of the rollout distribution from
the training one:

- ``mismatch/kl_k1``: mean of ``log p_rollout - log p_train`` (unbiased KL(rollout || train), can be < 0);
- ``mismatch/kl_k3``: mean of ``r - 1 - log r`` (the same KL, never negative, lower variance);
- ``mismatch/chi2_token``: mean of ``(r - 1)^2``, the token-level chi-square divergence;
- ``mismatch/chi2_seq``: mean over sequences of ``(w - 1)^2``, the sequence-level one (what a
  sequence-level importance weight pays; it grows with length);
- ``mismatch/log_ppl_diff``: mean over sequences of (mean log p_train - mean log p_rollout) over the
  sequence's tokens, i.e. ``log ppl(rollout) - log ppl(train)``: > 0 when the trainer finds the samples
  more likely than the engine that drew them;
- ``mismatch/ess_seq``: effective sample size of the sequence weights, ``(sum w)^2 / (N sum w^2)`` in
  ``(0, 1]`` (1: all weights equal), computed in log space so long sequences do not overflow it;
- ``mismatch/prob_corr``: Pearson correlation of the token probabilities ``p_train`` and ``p_rollout``
  (MiniMax-M1 tracks it and reports it rising once the LM head computes in fp32).

The share of tokens a correction masks or clips is the correction's own metric, not repeated here.
Everything is reduced on the tensors' device and read back once.
"""

from __future__ import annotations

import torch

KEYS = ("kl_k1", "kl_k3", "chi2_token", "chi2_seq", "log_ppl_diff", "ess_seq", "prob_corr")


def mismatch_metrics(
    logp_train_NT: torch.Tensor,
    logp_rollout_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    prefix: str = "mismatch",
) -> dict[str, float]:
    """The divergences above over ``mask_NT``'s tokens, keyed ``{prefix}/{name}`` (NaN with no token)."""
    train_NT = logp_train_NT.detach().double()
    rollout_NT = logp_rollout_NT.detach().double()
    log_r_NT = train_NT - rollout_NT
    valid_NT = mask_NT.bool() & torch.isfinite(log_r_NT)
    n_tokens = int(valid_NT.sum())
    if n_tokens == 0:
        return {f"{prefix}/{k}": float("nan") for k in KEYS}
    zero = torch.zeros_like(log_r_NT)
    log_r_NT = torch.where(valid_NT, log_r_NT, zero)
    r_NT = torch.where(valid_NT, log_r_NT.exp(), zero)
    kl_k1 = -log_r_NT.sum() / n_tokens
    kl_k3 = torch.where(valid_NT, r_NT - 1 - log_r_NT, zero).sum() / n_tokens
    chi2_token = torch.where(valid_NT, (r_NT - 1) ** 2, zero).sum() / n_tokens

    count_N = valid_NT.sum(dim=1)
    has_N = count_N > 0  # a response with no kept token has no weight to report
    log_w_S = log_r_NT.sum(dim=1)[has_N]
    chi2_seq = ((log_w_S.exp() - 1) ** 2).mean()
    log_ppl_diff = (log_r_NT.sum(dim=1)[has_N] / count_N[has_N]).mean()
    shifted_S = log_w_S - log_w_S.max()  # ESS is scale-free: exp(log w - max) keeps it finite
    ess_seq = (
        torch.logsumexp(shifted_S, 0).mul(2).sub(torch.logsumexp(2 * shifted_S, 0)).exp() / log_w_S.numel()
    )

    p_train = train_NT[valid_NT].exp()
    p_rollout = rollout_NT[valid_NT].exp()
    dt, dr = p_train - p_train.mean(), p_rollout - p_rollout.mean()
    prob_corr = (dt * dr).sum() / ((dt * dt).sum() * (dr * dr).sum()).sqrt()

    values = torch.stack([kl_k1, kl_k3, chi2_token, chi2_seq, log_ppl_diff, ess_seq, prob_corr]).tolist()
    return {f"{prefix}/{k}": float(v) for k, v in zip(KEYS, values, strict=True)}
