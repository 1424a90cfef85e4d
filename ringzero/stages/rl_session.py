"""Everything an RL stage holds while it runs, built from the run config, the stage and its inputs.

Start weights are the stage's init checkpoint, or the last committed resume point of this exact stage
(weights, optimizer state, step, stop tracking and summary history); the rollout engine then receives
those weights before the first step, so a resumed stage samples from where it stopped. The KL
reference is a frozen copy of ``inputs.reference_uri`` (the init when unset), loaded only when used; the
accuracy anchor (``stage.anchor``) samples the same weights with an embedded engine of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog
import torch

from ringzero.config.run import RunConfig
from ringzero.config.stages import RLStage
from ringzero.engines.builders import apply_threads, start_model, task_and_tokenizer
from ringzero.engines.training import EngineOptimizer, TrainingSetup
from ringzero.errors import RingzeroError
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.precision import body_dtype
from ringzero.parallel.one_writer import writes_on_rank0
from ringzero.parallel.runtime import Runtime, single
from ringzero.rl.anchor import Anchor
from ringzero.rl.openings import Opening
from ringzero.rl.rewards import TaskReward
from ringzero.rl.seeds import derive_seed
from ringzero.rl.step import RLStep, StepShape
from ringzero.rl.trainer import PolicyTrainer
from ringzero.rollout.deployment.connect import rollout_client as build_rollout_client
from ringzero.rollout.deployment.weight_push import WeightPusher, weight_version
from ringzero.rollout.types import RolloutClient
from ringzero.stages.train_state import ResumePoint
from ringzero.stages.training_engine import start_training, training_engine
from ringzero.tasks.base import Task
from ringzero.tokenizer.base import Tokenizer

log = structlog.get_logger(__name__)

ROLLOUT_MAX_BATCH = 256
"""Rows the embedded engine decodes together: a whole tiny-config rollout batch in one group."""


@dataclass
class RolloutSide:
    """The engine the stage samples from, the precision it runs under and how it receives the trainer's
    weights: one object, so an engine rebuilt by a rollback is the one the step, the held-out evaluation and
    every push see."""

    client: RolloutClient
    policy: PrecisionPolicy
    pusher: WeightPusher
    weights: Callable[[], dict[str, torch.Tensor]]  # the trainer's master weights, read at each push

    def push(self, step: int) -> object:
        """Serve the trainer's weights after 0-based ``step`` (version ``step + 1``)."""
        return self.pusher.push(
            self.client, self.weights(), weight_version(step + 1), dtype=body_dtype(self.policy)
        )


@dataclass
class RLSession:
    cfg: RunConfig
    stage: RLStage
    runtime: Runtime
    setup: TrainingSetup
    task: Task
    tokenizer: Tokenizer
    rollout: RolloutSide
    stepper: RLStep
    resume: ResumePoint | None

    @property
    def model(self) -> torch.nn.Module:
        return self.setup.model

    @property
    def optimizer(self) -> EngineOptimizer:
        return self.setup.optimizer

    @property
    def first_step(self) -> int:
        return 0 if self.resume is None else self.resume.step

    @property
    def resumed(self) -> dict:
        """The resume point's loop state (empty for a fresh stage)."""
        return {} if self.resume is None else self.resume.meta

    @property
    def base_lr(self) -> float:
        """The stage's peak lr, before any lower_lr rollback remedy."""
        return self.stage.optim.lr

    def push(self, step: int) -> None:
        self.rollout.push(step)

    def rebuild_rollout(self, policy: str) -> None:
        """Serve from a new rollout engine under precision ``policy`` (a preset name), holding the trainer's
        current weights; the stage samples and evaluates with it from then on."""
        self.rollout.policy = PrecisionPolicy.preset(policy)
        precision = self.cfg.precision.model_copy(update={"rollout": self.rollout.policy})
        cfg = self.cfg.model_copy(update={"precision": precision})
        self.rollout.client = rollout_client(
            cfg, self.setup.sampler_model(cfg.engines), self.tokenizer, self.runtime
        )
        log.info("rl.rollout_rebuilt", precision=policy)


def rollout_client(cfg, model, tokenizer, runtime: Runtime | None = None):
    """The stage's rollout engine, spread over the job's ranks (each samples its share of requests)."""
    runtime = runtime or single(next(model.parameters()).device)
    return build_rollout_client(
        cfg,
        model,
        tokenizer,
        runtime,
        deterministic=cfg.precision.deterministic,
        max_batch=ROLLOUT_MAX_BATCH,
        seed=cfg.run.seed,
    )


def build_session(ctx, stage: RLStage, inputs) -> RLSession:
    cfg, rt = ctx.cfg, ctx.runtime
    if cfg.precision.deterministic and cfg.precision.train != cfg.precision.rollout:
        raise RingzeroError(
            "precision.deterministic: train and rollout must use the same policy "
            f"(got {cfg.precision.train.name()} and {cfg.precision.rollout.name()})"
        )
    _check_rollback(cfg, stage)
    apply_threads(cfg)
    task, tokenizer = task_and_tokenizer(cfg)
    setup, resume = start_training(ctx, stage, inputs.init_uri, total_steps=stage.steps, schedule="constant")
    reference, reference_uri = None, inputs.reference_uri or inputs.init_uri
    if stage.loss.kl_coef > 0:
        reference = training_engine(cfg).frozen(cfg, ctx.store, reference_uri, cfg.precision.train, rt)
    # Rollout servers take a push from rank 0 alone (the tensors, a folder, or a checkpoint rank 0 writes):
    # only it gathers the full weights. An embedded engine on every rank needs them on every rank.
    everywhere = cfg.engines.rollout.kind == "embedded" or not writes_on_rank0(ctx.store)
    rollout = RolloutSide(
        client=rollout_client(cfg, setup.sampler_model(cfg.engines), tokenizer, rt),
        policy=cfg.precision.rollout,
        pusher=WeightPusher.for_rollout(
            cfg.engines.rollout,
            model_cfg=cfg.model,
            store=ctx.store,
            prefix=ctx.checkpoint_prefix,
            runtime=rt,
            tokenizer=tokenizer,
        ),  # fmt: skip
        weights=lambda: setup.optimizer.master_state_dict(everywhere),
    )
    trainer = PolicyTrainer(
        setup.model,
        setup.optimizer,
        stage.loss,
        minibatches=stage.minibatches,
        max_new_tokens=stage.sampling.max_new_tokens,
        temperature=stage.sampling.temperature,
        reference=reference,
        batch_invariant=cfg.precision.deterministic,
        pad_id=tokenizer.pad_id,
        runtime=rt,
        sharding=cfg.parallel.sharding,
        micro_batch=stage.micro_batch,
    )
    stepper = RLStep(
        rollout=rollout,
        trainer=trainer,
        task=task,
        tokenizer=tokenizer,
        reward=TaskReward(task, stage.tiers, stage.tier_reward, stage.tier_penalty),
        sampling=stage.sampling,
        shape=StepShape(stage.prompts_per_step, stage.samples_per_prompt, stage.loss.advantage_std),
        seed=cfg.run.seed,
        seeded_sampling=cfg.engines.rollout.kind == "embedded",
        opening=_opening(stage, task, tokenizer),
        anchor=_anchor(cfg, ctx.store, stage, reference_uri, reference, tokenizer, rt),
    )
    session = RLSession(cfg, stage, rt, setup, task, tokenizer, rollout, stepper, resume)
    session.push(session.first_step - 1)  # the engine serves the start (or resumed) weights, as trained
    return session


def _opening(stage, task, tokenizer: Tokenizer) -> Opening | None:
    fo = stage.forced_opening
    if fo is None:
        return None
    guesses = None
    if fo.answer == "guess":
        answers = task.answer_space()
        if not answers:
            raise RingzeroError(
                f"stages.{stage.name}.forced_opening.answer guess: the task has no finite answer "
                "space to draw a guess from"
            )
        guesses = tuple(tuple(tokenizer.encode(a + task.stop[0])) for a in answers)
    tags = None if fo.tiers is None else frozenset(t.tag for t in stage.tiers if t.name in fo.tiers)
    return Opening(tuple(tokenizer.encode(fo.text)), fo.samples(stage.samples_per_prompt), guesses, tags)


def _anchor(
    cfg, store, stage, uri: str | None, reference, tokenizer: Tokenizer, runtime: Runtime
) -> Anchor | None:
    """An embedded engine over the frozen reference's weights, whatever engine serves the policy: the KL
    reference's copy when it is a ``HybridLM`` (the engine copies it under the rollout policy), else the
    checkpoint loaded once more (the megatron engine's reference is no ``HybridLM``; no KL term, none
    loaded)."""
    if stage.anchor is None:
        return None
    if not isinstance(reference, HybridLM):
        reference = start_model(cfg, store, uri, cfg.precision.rollout).to(runtime.device).eval()
    client = build_rollout_client(
        cfg,
        reference,
        tokenizer,
        runtime,
        deterministic=cfg.precision.deterministic,
        max_batch=ROLLOUT_MAX_BATCH,
        seed=derive_seed(cfg.run.seed, "anchor-engine"),
        local=True,
    )
    tags = frozenset(t.tag for t in stage.tiers if t.name in stage.anchor.tiers)
    return Anchor(client, tags, stage.anchor.samples)


def _check_rollback(cfg, stage) -> None:
    """A raise_precision remedy rebuilds an embedded engine; it cannot change a server's launch dtype."""
    if stage.rollback is None or stage.rollback.remedy != "raise_precision":
        return
    if cfg.engines.rollout.kind != "embedded":
        raise RingzeroError(
            "rollback.remedy raise_precision rebuilds the embedded rollout engine; an SGLang "
            "server's precision is fixed when it starts (use skip_batch or lower_lr)"
        )
    if cfg.precision.deterministic:
        raise RingzeroError(
            "rollback.remedy raise_precision: precision.deterministic needs train and rollout "
            "under the same policy, so the rollout's cannot be raised alone"
        )
