"""The training engine a stage trains with, chosen once from ``engines.training.kind``, and the start every
training stage shares (``start_training``).

Stages never import an engine directly; megatron-core is imported only when the config names it.
"""

from __future__ import annotations

import structlog

from ringzero.engines.training import TrainingEngine, TrainingSetup
from ringzero.stages.train_state import ResumePoint, load_resume_point

log = structlog.get_logger(__name__)


def training_engine(cfg) -> TrainingEngine:
    """The engine ``cfg.engines.training`` names."""
    kind = cfg.engines.training.kind
    if kind == "megatron":
        from ringzero.engines.megatron.engine import MegatronEngine

        return MegatronEngine(cfg.engines.training)
    from ringzero.engines.torch_engine import TorchEngine

    return TorchEngine()


def start_training(
    ctx, stage, init_uri: str | None, *, total_steps: int, schedule: str
) -> tuple[TrainingSetup, ResumePoint | None]:
    """The stage's model and optimizer from ``init_uri`` on this rank's layout, and the stage's last
    committed resume point loaded into them (None for a fresh start)."""
    cfg = ctx.cfg
    setup = training_engine(cfg).build(
        cfg, ctx.store, init_uri, cfg.precision.train, ctx.runtime,
        optim=stage.optim, total_steps=total_steps, schedule=schedule,
    )  # fmt: skip
    resume = None
    if uri := ctx.resume_uri():
        resume = load_resume_point(ctx.store, uri, setup.optimizer)
        log.info(f"{stage.kind}.resume", uri=uri, step=resume.step)  # pretrain.resume, rl.resume, ...
    return setup, resume
