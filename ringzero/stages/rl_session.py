"""Everything an RL stage holds while it runs, built from the run config, the stage and its inputs.

Start weights are the stage's init checkpoint, or the last committed resume point of this exact stage
(weights, optimizer state, step, stop tracking and summary history); the rollout engine then receives
those weights before the first step, so a resumed stage samples from where it stopped. The KL
reference is a frozen copy of ``inputs.reference_uri`` (the init when unset), loaded only when used; the
accuracy anchor (``stage.anchor``) samples the same weights with an embedded engine of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

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
from ringzero.stages.train_state import load_resume_point
from ringzero.stages.training_engine import training_engine
from ringzero.tokenizer.base import Tokenizer

log = structlog.get_logger(__name__)

ROLLOUT_MAX_BATCH = 256
"""Rows the embedded engine decodes together: a whole tiny-config rollout batch in one group."""


@dataclass
class RLSession:
    model: Any
    optimizer: EngineOptimizer
    client: Any
    task: Any
    tokenizer: Any
    stepper: RLStep
    first_step: int = 0
    resumed: dict = field(default_factory=dict)
    cfg: Any = None
    runtime: Runtime | None = None
    base_lr: float = 0.0  # the stage's peak lr, before any lower_lr rollback remedy
    rollout_policy: PrecisionPolicy | None = None  # what the rollout engine runs under now
    setup: TrainingSetup | None = None

    def push(self, step: int) -> None:
        self.stepper.push(step)

    def rebuild_rollout(self, policy: str) -> None:
        """Serve from a new rollout engine under precision ``policy`` (a preset name), holding the trainer's
        current weights; the stage samples and evaluates with it from then on."""
        self.rollout_policy = PrecisionPolicy.preset(policy)
        cfg = self.cfg.model_copy(
            update={"precision": self.cfg.precision.model_copy(update={"rollout": self.rollout_policy})}
        )
        self.client = self.stepper.client = rollout_client(
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


def build_session(ctx, stage, inputs) -> RLSession:
    cfg = ctx.cfg
    if cfg.precision.deterministic and cfg.precision.train != cfg.precision.rollout:
        raise RingzeroError(
            "precision.deterministic: train and rollout must use the same policy "
            f"(got {cfg.precision.train.name()} and {cfg.precision.rollout.name()})"
        )
    _check_rollback(cfg, stage)
    apply_threads(cfg)
    task, tokenizer = task_and_tokenizer(cfg)
    rt = ctx.runtime
    engine = training_engine(cfg)
    setup = engine.build(
        cfg,
        ctx.store,
        inputs.init_uri,
        cfg.precision.train,
        rt,
        optim=stage.optim,
        total_steps=stage.steps,
        schedule="constant",
    )
    model, optimizer = setup.model, setup.optimizer
    first, resumed = 0, {}
    if resume := ctx.resume_uri():
        point = load_resume_point(ctx.store, resume, optimizer)
        first, resumed = point.step, point.meta
        log.info("rl.resume", uri=resume, step=first)
    reference, reference_uri = None, inputs.reference_uri or inputs.init_uri
    if stage.loss.kl_coef > 0:
        reference = engine.frozen(cfg, ctx.store, reference_uri, cfg.precision.train, rt)
    client = rollout_client(cfg, setup.sampler_model(cfg.engines), tokenizer, rt)

    remote = cfg.engines.rollout
    pusher = WeightPusher.for_rollout(
        remote,
        model_cfg=cfg.model,
        store=ctx.store,
        prefix=ctx.checkpoint_prefix,
        runtime=rt,
        tokenizer=tokenizer,
    )
    session = RLSession(
        model,
        optimizer,
        client,
        task,
        tokenizer,
        None,
        first,
        resumed,
        cfg,
        rt,
        base_lr=stage.optim.lr,
        rollout_policy=cfg.precision.rollout,
        setup=setup,
    )

    # Rollout servers take a push from rank 0 alone (the tensors, a folder, or a checkpoint rank 0 writes):
    # only it gathers the full weights. An embedded engine on every rank needs them on every rank.
    everywhere = remote.kind == "embedded" or not writes_on_rank0(ctx.store)

    def push(step: int):  # to the session's engine of the moment (a raise_precision rollback rebuilds it)
        return pusher.push(
            session.client,
            optimizer.master_state_dict(everywhere),
            weight_version(step + 1),
            dtype=body_dtype(session.rollout_policy),
        )

    trainer = PolicyTrainer(
        model,
        optimizer,
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
        client=client,
        trainer=trainer,
        task=task,
        tokenizer=tokenizer,
        reward=TaskReward(task, stage.tiers, stage.tier_reward, stage.tier_penalty),
        sampling=stage.sampling,
        shape=StepShape(stage.prompts_per_step, stage.samples_per_prompt, stage.loss.advantage_std),
        seed=cfg.run.seed,
        push=push,
        seeded_sampling=cfg.engines.rollout.kind == "embedded",
        opening=_opening(stage, task, tokenizer),
        anchor=_anchor(cfg, ctx.store, stage, reference_uri, reference, tokenizer, rt),
    )
    session.stepper = stepper
    push(first - 1)  # the engine serves the start (or resumed) weights, as the trainer holds them
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
