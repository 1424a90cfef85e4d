"""Resume points and final checkpoints of a training stage, through the checkpoint store.

A resume point ``<prefix>/step-NNNNNN`` is ONE checkpoint holding the model's fp32 (master) weights
under ``model.*``, the optimizer state under ``optim.*`` and the loop's counters in its meta: a single
commit, so there is never a model without its optimizer state or the other way round. Step counters
and RNG seeds are derived from the step number (see the stages), so nothing else needs saving.

Resume points keep ringzero's own state-dict keys (they are read back only by the stage that wrote
them). The final checkpoint ``<prefix>/final`` is a model checkpoint in the Ling 2.5 format, tokenizer
included: a folder SGLang serves (``load_model`` reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from ringzero.engines.optimizer import TrainOptimizer
from ringzero.errors import IntegrityError, RingzeroError
from ringzero.model.checkpoint import save_state
from ringzero.model.hf_format import hf_config
from ringzero.model.hybrid import HybridLM
from ringzero.parallel.one_writer import writes_on_rank0
from ringzero.stages import preemption

log = structlog.get_logger(__name__)

MODEL, OPTIM = "model.", "optim."


def step_name(prefix: str, step: int) -> str:
    return f"{prefix}/step-{step:06d}"


def final_name(prefix: str) -> str:
    return f"{prefix}/final"


@dataclass
class ResumePoint:
    step: int
    uri: str
    meta: dict[str, Any] = field(default_factory=dict)


def save_resume_point(
    store, prefix: str, step: int, model: HybridLM, optimizer: TrainOptimizer, meta: dict | None = None
) -> str:
    everywhere = not writes_on_rank0(store)  # else rank 0 alone gathers the full state: it alone writes
    optim_tensors, optim_meta = optimizer.state(everywhere)
    tensors = {
        MODEL + k: v.detach().float().contiguous() for k, v in optimizer.master_state_dict(everywhere).items()
    }
    tensors.update({OPTIM + k: v.contiguous() for k, v in optim_tensors.items()})
    full_meta = {"step": step, "optimizer": optim_meta, **(meta or {})}
    return store.save(step_name(prefix, step), tensors, hf_config(model.cfg, torch.float32), full_meta)


def end_of_step(
    ctx,
    stage_name: str,
    step: int,
    model: HybridLM,
    optimizer: TrainOptimizer,
    runtime,
    *,
    checkpoint: bool,
    meta: dict | None = None,
) -> bool:
    """The tail of every training loop's step: a resume point when ``checkpoint`` says one is due or a
    SIGTERM asked the job to stop (every rank asks, so the ranks agree), then the exit of a preempted
    stage (``Preempted``, status 143) once that point is committed. ``step`` is the number of steps done.
    Returns whether a resume point was saved."""
    preempted = preemption.due(runtime)
    if checkpoint or preempted:
        save_resume_point(ctx.store, ctx.checkpoint_prefix, step, model, optimizer, meta)
    if preempted:
        log.info("stage.preempted", stage=stage_name, step=step)
        raise preemption.Preempted(stage_name, step)
    return checkpoint


def load_resume_point(store, uri: str, optimizer: TrainOptimizer) -> ResumePoint:
    """Restore the optimizer's model and state in place from the resume point at ``uri``."""
    try:
        ckpt = store.load(uri)
    except IntegrityError as exc:
        # never train from it, and never skip it silently: a damaged store is the user's to inspect
        raise IntegrityError(
            f"cannot resume from {uri}: {exc}. Nothing was trained from it; delete that "
            "folder to resume from the resume point before it, or check the store with "
            "`ringzero store verify`"
        ) from None
    if "step" not in ckpt.meta or "optimizer" not in ckpt.meta:
        raise RingzeroError(f"{uri}: not a resume point of a training stage (meta lacks step/optimizer)")
    weights = {k[len(MODEL) :]: v for k, v in ckpt.tensors.items() if k.startswith(MODEL)}
    optimizer.load_weights(weights, source=uri)
    optimizer.load_state(
        {k[len(OPTIM) :]: v for k, v in ckpt.tensors.items() if k.startswith(OPTIM)}, ckpt.meta["optimizer"]
    )
    extra = {k: v for k, v in ckpt.meta.items() if k not in ("step", "optimizer")}
    return ResumePoint(int(ckpt.meta["step"]), ckpt.uri, extra)


def weights_to_write(store, optimizer) -> dict[str, torch.Tensor]:
    """The optimizer's full fp32 weights where ``store`` writes them: on rank 0 only (``{}`` elsewhere) when
    only rank 0 writes, so a sharding engine never builds the full model on the other ranks."""
    return optimizer.master_state_dict(everywhere=not writes_on_rank0(store))


def save_final(
    store, prefix: str, model: HybridLM, state_dict: dict[str, torch.Tensor], meta: dict, tokenizer=None
) -> str:
    """The stage's output model; an earlier attempt that committed it already (then died) is reused."""
    name = final_name(prefix)
    existing = store.list(name)
    if any(store.name_of(uri) == name for uri in existing):
        return store.uri_of(name)
    return save_state(store, name, model.cfg, state_dict, meta, tokenizer)
