"""Train/rollout mismatch corrections, each a small loss-side module: a stop-gradient per-token weight
and/or a mask over tokens or whole responses, composed with the stage's policy loss.

- ``tis``: token-level truncated IS, w_t = min(r_t, cap);
- ``seq_is``: sequence-level IS, w_i = min(prod_t r_t, cap) or min(exp(mean_t log r_t), cap);
- ``masked_is``: drop tokens, or whole responses (product or geometric mean), outside [lower, upper];
- ``icepop``: drop tokens outside [lower, upper] (0.5..5.0), weigh the kept ones by r_t;
- ``veto``: drop a response when any token ratio is below ``floor``.

Each reads the raw per-token log r, in float64; a sequence-level one sums (or averages) it first and bounds
only the total. A response with a non-finite log r on any token is dropped whole before any correction
runs (``compose.NONFINITE_RULE``).

Listed in ``LossSettings.corrections``; applied in that order, weights multiply and masks AND together
(``compose.apply_corrections``). Each reports ``correction/<kind>/...``; the batch reports
``correction/sequences_dropped``, ``correction/token_masked_frac``, ``correction/weight_mean`` and
``correction/nonfinite_tokens`` / ``correction/nonfinite_sequences``.

Which ratio, and in which order (decoupled, as verl's "decoupled" rollout correction): when any correction
is listed, the trainer first scores the whole rollout batch once, without gradient, under the weights the
engine sampled with (``PolicyTrainer.correct``): logp_old. The corrections read the mismatch ratio
r_t = exp(logp_old_t - logp_rollout_t), fixed for the step; the policy loss then takes logp_old as its
denominator, so its ratio (and clip) measures only the drift of the step's own updates (1 on the first
minibatch, up to the rounding of a forward over other row groupings), and the product of the two is the full
train/rollout ratio, the mismatch part corrected. Without corrections nothing changes: no extra forward, the
rollout log-probs are the denominator. Keeping the rollout denominator with a correction on top would count
the mismatch twice.

Because the masks exist before any update, a response they drop is known before advantages are
computed: ``RLStep`` passes ``keep_N`` to ``group_advantages``, so a dropped response adds nothing to its
group's mean and std (and gets zero advantage), and the step's ``reward/*`` metrics count only kept
responses. In the loss a dropped token is out of both the policy and the KL term; the denominators stay
the batch's shape (``token_sum``: the constant D; ``sample_mean``: the minibatch's responses, each
averaged over its kept tokens), so dropping never scales up what remains. The cost is one no-grad
forward over the batch per step.

Importing this package imports no torch (the stage configs import ``corrections.config``).
"""
