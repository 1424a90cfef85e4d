"""Typed settings of each stage kind. A run's ``stages`` list is a discriminated union on ``kind``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ringzero.config.corrections import Correction
from ringzero.config.gates import ThresholdExpr
from ringzero.model.config import PRESETS, PrecisionPolicy
from ringzero.strict_model import Slug, StrictModel
from ringzero.tasks.base import DIFFICULTY_BUCKETS
from ringzero.tasks.base import TIER_CONTRAST as CONTRAST


class StagePrecision(StrictModel):
    """A stage's own engine precision, in place of the run's ``precision`` (null fields keep the run's)."""

    train: PrecisionPolicy | None = None
    rollout: PrecisionPolicy | None = None


class StageBase(StrictModel):
    name: Slug = Field(..., description="unique stage name (lowercase, digits, '-')")
    init: str | None = Field(
        None,
        description="input checkpoint: an earlier stage's name or a URI; null = the previous stage's output",
    )
    gate: list[ThresholdExpr] = Field(
        default_factory=list, description="thresholds over this stage's summary; all must hold to go on"
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="this stage's seed in place of run.seed, so seeds of later stages vary over one shared "
        "base (ringzero ablate); null = run.seed",
    )
    precision: StagePrecision | None = Field(
        None, description="this stage's train / rollout precision in place of the run's; null = the run's"
    )


class OptimSettings(StrictModel):
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)


class SamplingSettings(StrictModel):
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 = off")


class PretrainStage(StageBase):
    """Next-token training of the base model on the task's synthetic corpus."""

    kind: Literal["pretrain"] = "pretrain"
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(32, ge=1)
    micro_batch: int = Field(
        32,
        ge=1,
        description="rows one rank runs forward and backward at a time; "
        "gradients accumulate over its micro-batches (memory, never the result)",
    )
    seq_len: int = Field(128, ge=8)
    optim: OptimSettings = OptimSettings(lr=3e-3, warmup_steps=50, weight_decay=0.1)
    checkpoint_every: int = Field(200, ge=1)


class LossSettings(StrictModel):
    kind: Literal["sg_clip_is", "ppo_clip"] = "sg_clip_is"
    eps_high: float = Field(0.28, gt=0, description="upper clip: weight = min(r, 1 + eps_high)")
    eps_low: float | None = Field(None, gt=0, lt=1, description="optional lower clip, for ablations only")
    normalization: Literal["token_sum", "sample_mean", "token_mean"] = Field(
        "token_sum",
        description="token_sum: unnormalized token-level (stage 1); sample_mean: per-sample, verl's "
        "seq-mean-token-mean (stage 2+); token_mean: the token sum over the minibatch's loss tokens (DAPO, "
        "verl's token-mean)",
    )
    token_sum_denominator: int | None = Field(
        None, ge=1, description="constant D for token_sum; null = sequences x max_new_tokens"
    )
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the frozen reference, as a loss term")
    advantage_std: bool = Field(True, description="divide group-centered rewards by the group std")
    routing_replay: bool = Field(
        False,
        description="MoE: rescore with the experts the rollout engine chose for each token (R3); the "
        "router's weights still come from the trainer's forward",
    )
    corrections: list[Correction] = Field(
        default_factory=list,
        description="train/rollout mismatch corrections (tis, seq_is, masked_is, icepop, "
        "veto), applied in order: weights multiply, masks AND; any one makes the policy ratio's denominator "
        "the "
        "trainer's pre-update log-probs, and dropped responses leave the group baselines "
        "(ringzero.rl.corrections)",
    )

    @field_validator("corrections")
    @classmethod
    def _one_correction_per_kind(cls, v: list) -> list:
        kinds = [c.kind for c in v]
        if len(set(kinds)) != len(kinds):
            raise ValueError(
                f"each correction kind may be listed once (got {kinds}): its metrics are per kind"
            )
        return v


class Tier(StrictModel):
    """One reasoning tier of tier RL. An untagged tier (``tag: null``) keeps the default mode, the prompt as
    is, in the training mix (Thinkless trains both modes in every batch; AdaptThink and L1/LCPO keep the
    full mode beside the budgeted ones), so tier RL does not leave untagged prompts untrained."""

    name: Slug
    tag: str | None = Field(
        ...,
        min_length=1,
        description="text put in the prompt to request this tier; null = "
        "the prompt asked as is (the untagged default mode, at most one such tier a stage)",
    )
    budget: int | None = Field(
        ...,
        ge=1,
        description="token budget of the response; null = no budget "
        "penalty, the task's plain verdict (e.g. a deep tier, or the untagged one)",
    )
    weight: float = Field(1.0, gt=0, description="sampling weight among tiers")

    @field_validator("name")
    @classmethod
    def _not_a_bucket(cls, v: str) -> str:
        if v in DIFFICULTY_BUCKETS:
            raise ValueError(
                f"{v!r} names a difficulty bucket ({', '.join(DIFFICULTY_BUCKETS)}), whose metrics "
                "would share the tier's keys; pick another tier name"
            )
        if v == CONTRAST:
            raise ValueError(
                f"{CONTRAST!r} heads the deep-against-fast tier measures (rl.tier_metrics.depth_contrast); "
                "pick another tier name"
            )
        return v


class ForcedOpening(StrictModel):
    """AdaptThink's cold start for tier RL: a share of each prompt's samples opens with ``text``
    (ringzero.rl.openings)."""

    text: str = Field(
        "<think> </think>",
        min_length=1,
        description="the forced prefix of the response; "
        "the default is the empty thought, the answer with no reasoning",
    )
    fraction: float = Field(
        0.25,
        gt=0,
        lt=1,
        description="share of each prompt's samples that open with text "
        "(rounded; at least one, and at least one left to the policy)",
    )
    answer: Literal["policy", "guess"] = Field(
        "policy",
        description="policy: the policy writes the rest of a forced sample; guess: the rest is an "
        "answer drawn uniformly from the task's answers, then its stop (scored, not sampled)",
    )
    tiers: list[Slug] | None = Field(
        None,
        min_length=1,
        description="names of the stage's tiers whose prompts get forced samples (the "
        "untagged tier by its name too); prompts of other tiers get every sample from the policy. null = "
        "every "
        "prompt",
    )

    def samples(self, n: int) -> int:
        return round(self.fraction * n)


class AnchorSettings(StrictModel):
    """AdaptThink's accuracy constraint (Zhang et al., 2025): the policy may trade depth for length only while
    its accuracy stays at least the reference model's. For prompts of ``tiers`` the advantage baseline is the
    frozen reference's mean reward on that very prompt, ``A_i = R_i - R_ref(x)`` (no group-std division), in
    place of the group mean (ringzero.rl.anchor)."""

    tiers: list[Slug] = Field(
        ...,
        min_length=1,
        description="names of the stage's tiers whose prompts are anchored (e.g. the untagged one and deep)",
    )
    samples: int = Field(
        4,
        ge=1,
        description="responses the frozen reference gives each anchored prompt per "
        "step; their mean reward is the prompt's baseline R_ref(x)",
    )


Remedy = Literal["skip_batch", "lower_lr", "raise_precision"]

NONFINITE_PREFIXES = ("loss/", "grad/", "ratio/", "logratio/", "gap/", "kl/", "entropy/", "optim/", "drift/")
"""Metrics that must be finite on a healthy step. Others may be NaN by definition (``trace/accuracy``
of a batch without a trace, ``reward/accuracy`` of an empty batch) and never trigger."""
NONFINITE_FLAGS = ("loss/nonfinite", "ratio/nonfinite_frac")
"""The trainer's own counts of non-finite losses and ratios: any value above 0 triggers."""
PRECISION_LADDER = {"bf16": "fp32-islands", "fp32-islands": "fp32"}


class RollbackSettings(StrictModel):
    on: list[ThresholdExpr] = Field(
        default_factory=list, description="any holding on a step's metrics rolls back"
    )
    nonfinite: bool = Field(True, description="a non-finite training metric rolls back")
    remedy: Remedy = "skip_batch"
    lr_factor: float = Field(0.5, gt=0, lt=1, description="lower_lr: the peak lr is multiplied by this")
    max_rollbacks: int = Field(
        3, ge=0, description="rollbacks allowed; a trigger beyond them fails the stage"
    )
    every: int = Field(1, ge=1, description="steps between in-memory snapshots of the good state")

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data):
        if isinstance(data, dict) and True in data:  # YAML 1.1 reads a bare `on:` key as the boolean true
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data


class RLStage(StageBase):
    """One RL stage: stage 1 (token_sum), stage 2 (sample_mean) or tier RL (tiers set)."""

    kind: Literal["rl"] = "rl"
    steps: int = Field(100, ge=1)
    prompts_per_step: int = Field(32, ge=1)
    samples_per_prompt: int = Field(8, ge=1)
    minibatches: int = Field(4, ge=1, description="optimizer updates per rollout batch (the paper: 512/32)")
    micro_batch: int = Field(
        16,
        ge=1,
        description="rows one rank runs forward and backward at a time; "
        "gradients accumulate over its micro-batches (memory, never the result)",
    )
    optim: OptimSettings = OptimSettings(lr=2e-4, warmup_steps=20)
    sampling: SamplingSettings = SamplingSettings()
    loss: LossSettings = LossSettings()
    reference: str | None = Field(None, description="frozen KL reference: stage name or URI; null = the init")
    checkpoint_every: int = Field(25, ge=1)
    min_steps: int = Field(10, ge=0, description="stop conditions are checked only after this many steps")
    stop_when: list[ThresholdExpr] = Field(default_factory=list, description="any holding ends the stage")
    reward_plateau_steps: int | None = Field(
        None, ge=2, description="stop if reward/mean has not improved in N steps"
    )
    max_wall_minutes: float | None = Field(None, gt=0)
    tiers: list[Tier] = Field(default_factory=list)
    tier_reward: Literal["cutoff", "linear", "penalty"] = "cutoff"
    tier_penalty: float | None = Field(
        None,
        gt=0,
        description="with tier_reward penalty: the reward of a "
        "response over its tier's budget is -tier_penalty (ringzero.rl.rewards)",
    )
    forced_opening: ForcedOpening | None = Field(
        None,
        description="open a share of each prompt's samples with a fixed prefix, e.g. the empty thought "
        "(ringzero.rl.openings); null = the policy writes every sample",
    )
    rollback: RollbackSettings | None = Field(
        None,
        description="restore the last good step when a step's metrics cross a threshold or turn non-finite, "
        "then retry with a remedy (ringzero.stages.rollback); null = off",
    )
    anchor: AnchorSettings | None = Field(
        None,
        description="for prompts of these tiers, the advantage baseline is the frozen reference's accuracy "
        "on the prompt, sampled every step (AdaptThink's R - R_ref; ringzero.rl.anchor); null = the group "
        "mean",
    )

    @model_validator(mode="after")
    def _penalty_with_its_mode(self) -> RLStage:
        if (self.tier_reward == "penalty") != (self.tier_penalty is not None):
            raise ValueError(
                f"tier_penalty: set it exactly when tier_reward is penalty (tier_reward "
                f"{self.tier_reward}, tier_penalty {self.tier_penalty})"
            )
        return self

    @model_validator(mode="after")
    def _opening_fits(self) -> RLStage:
        if self.forced_opening is not None:
            m, n = self.forced_opening.samples(self.samples_per_prompt), self.samples_per_prompt
            if not 1 <= m <= n - 1:
                raise ValueError(
                    f"forced_opening.fraction ({self.forced_opening.fraction}) of samples_per_prompt "
                    f"({n}) gives {m} forced samples a prompt; it must be 1 to {n - 1}"
                )
        return self

    @model_validator(mode="after")
    def _minibatches_fit(self) -> RLStage:
        total = self.prompts_per_step * self.samples_per_prompt
        if total % self.minibatches:
            raise ValueError(
                f"minibatches ({self.minibatches}) must divide prompts_per_step x samples_per_prompt "
                f"({total})"
            )
        return self

    @field_validator("tiers")
    @classmethod
    def _unique_tiers(cls, v: list[Tier]) -> list[Tier]:
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique (got {names})")
        untagged = [t.name for t in v if t.tag is None]
        if len(untagged) > 1:  # a response is told to its tier by the tag its prompt carries
            raise ValueError(f"tiers.tag: at most one tier may be untagged (tag null), got {untagged}")
        return v

    @model_validator(mode="after")
    def _named_tiers_exist(self) -> RLStage:
        names = [t.name for t in self.tiers]
        listed = [
            ("forced_opening.tiers", None if self.forced_opening is None else self.forced_opening.tiers),
            ("anchor.tiers", None if self.anchor is None else self.anchor.tiers),
        ]
        for field, wanted in listed:
            unknown = [n for n in wanted or () if n not in names]
            if unknown:
                raise ValueError(
                    f"{field}: {unknown} name no tier of this stage (its tiers: {names or 'none'})"
                )
        return self


class DistillStage(StageBase):
    """Self-distillation: keep the shortest correct of k samples per prompt and fine-tune on it."""

    kind: Literal["distill"] = "distill"
    prompts: int = Field(256, ge=1)
    samples_per_prompt: int = Field(8, ge=1)
    length_budget: int | None = Field(None, ge=1, description="drop correct samples longer than this")
    select: Literal["shortest", "random"] = Field(
        "shortest",
        description="which eligible sample of a prompt becomes its target: the shortest (the reset), or a "
        "random one (the control that tells compression by selection from fine-tuning on its own samples; "
        "the same prompts are kept either way)",
    )
    sampling: SamplingSettings = SamplingSettings()
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(32, ge=1)
    micro_batch: int = Field(
        32,
        ge=1,
        description="rows one rank runs forward and backward at a time; "
        "gradients accumulate over its micro-batches (memory, never the result)",
    )
    max_seq_len: int = Field(256, ge=8)
    optim: OptimSettings = OptimSettings(lr=7e-4, warmup_steps=10)
    init_weights: Literal["input", "base"] = Field(
        "input", description="fine-tune from the input policy or the base"
    )


class EvalStage(StageBase):
    """Greedy and sampled accuracy, length per tier, ratio tail, CoT qualities; compares stage checkpoints."""

    kind: Literal["eval"] = "eval"
    prompts: int = Field(128, ge=1)
    k: int = Field(4, ge=1, description="samples per prompt for pass@k and reproducibility")
    sampling: SamplingSettings = SamplingSettings(temperature=1.0)
    compare: list[str] = Field(
        default_factory=list, description="stage names whose checkpoints join the table"
    )
    gap_policies: list[str] = Field(
        default_factory=lambda: ["bf16", "fp32-islands"],
        description="rollout precision presets whose gap to the trainer is measured on each checkpoint's own "
        "samples (ringzero.stages.eval_gap); [] = off",
    )
    gap_max_responses: int | None = Field(
        256,
        ge=3,
        description="score at most this many sampled responses for the gap (every k-th one, "
        "k = ceil(responses / this)); null = all",
    )

    @field_validator("gap_policies")
    @classmethod
    def _known_policies(cls, v: list[str]) -> list[str]:
        if unknown := [p for p in v if p not in PRESETS]:
            raise ValueError(
                f"gap_policies: unknown precision preset(s) {unknown}; choose from {sorted(PRESETS)}"
            )
        if len(set(v)) != len(v):
            raise ValueError(
                f"gap_policies: each preset may be listed once (got {v}): its metrics are per preset"
            )
        return v


StageConfig = Annotated[PretrainStage | RLStage | DistillStage | EvalStage, Field(discriminator="kind")]
