"""Automatic rollback of an RL stage: restore the last good step when a step's metrics go bad, then retry.

After every step the stage checks its metrics against ``rollback.on`` (threshold expressions over any
metric key, parsed as gates are: ``gap/max > 2``, ``loss/total > 10``) and, with ``nonfinite``, for a
non-finite training number (``NONFINITE_PREFIXES``, or the trainer's own ``loss/nonfinite`` and
``ratio/nonfinite_frac`` flags). A trigger restores the good state, records the event and applies the
remedy before the step is run again:

- ``skip_batch``: the retried step draws its prompts, sampling seeds and minibatch shuffle from another
  seed (a different batch), the stage's other steps keep theirs;
- ``lower_lr``: the peak learning rate is multiplied by ``lr_factor`` from then on;
- ``raise_precision``: the rollout engine is rebuilt under the next precision policy (bf16 ->
  fp32-islands -> fp32), never past the trainer's own, and receives the restored weights.

The good state is an in-memory snapshot (on the CPU) of the fp32 master weights with buffers, the
optimizer state (Adam moments, master copies, step counters; under the megatron engine each rank's own
shards of them, ``local_snapshot``, so no rank holds the full model) and the loop's counters (step, stop
tracking, summary history, torch RNG), taken every ``every`` steps and at every resume point. Not the last
resume point: resume points are committed every ``checkpoint_every`` steps (25 by default), which would replay
up to 24 good steps per rollback, and a store round trip per step is much dearer than a host copy. The resume
point stays the crash-recovery point; the rollback tally (count, events, lr scale, precision, re-seeded steps)
rides in its meta, so a resumed stage keeps its remedies and its budget. Sampling seeds of the embedded engine
and all step seeds derive from the step number, so a restored step replays what it would have.

A trigger once ``max_rollbacks`` rollbacks were spent fails the stage with a ``RingzeroError`` naming
every trigger. Events reach the metrics (``rollback/count``, ``rollback/reason``, ``rollback/to_step``
in the record of the step that triggered), a structured log line, the summary (``rollback/count``) and
the outcome's ``extra["rollbacks"]``, which the run report lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from ringzero.config.stages import (  # noqa: F401 (re-exported)
    NONFINITE_FLAGS,
    NONFINITE_PREFIXES,
    PRECISION_LADDER,
    Remedy,
    RollbackSettings,
)
from ringzero.errors import RingzeroError
from ringzero.rl.seeds import derive_seed

log = structlog.get_logger(__name__)


def triggers(settings: RollbackSettings, metrics: dict[str, Any]) -> list[str]:
    """Why the step's ``metrics`` call for a rollback (empty: they do not)."""
    out = []
    if settings.nonfinite:
        bad = sorted(
            k
            for k, v in metrics.items()
            if k.startswith(NONFINITE_PREFIXES) and isinstance(v, int | float) and not math.isfinite(float(v))
        )
        out += [f"nonfinite: {k} = {float(metrics[k])}" for k in bad]
        out += [
            f"nonfinite: {k} = {float(metrics[k]):g} > 0"
            for k in NONFINITE_FLAGS
            if k in metrics and k not in bad and float(metrics[k]) > 0
        ]
    for threshold in settings.on:
        if threshold.metric in metrics:
            holds, text = threshold.check(metrics)
            if holds:
                out.append(f"on: {text}")
    return out


@dataclass
class Snapshot:
    step: int
    weights: dict[str, torch.Tensor]
    optim_tensors: dict[str, torch.Tensor]
    optim_meta: dict
    loop: Any  # the stage loop's own state, a copy
    rng: torch.Tensor
    local: dict | None = (
        None  # a sharding optimizer's own shards (``local_snapshot``): weights etc. stay empty
    )


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


@dataclass
class Rollback:
    """The stage's rollback guard: ``snapshot`` good states, ``check`` each step, ``restore`` and remedy."""

    settings: RollbackSettings
    seed: int
    count: int = 0
    events: list[dict] = field(default_factory=list)
    lr_scale: float = 1.0
    precision: str | None = None  # the rollout policy a raise_precision remedy switched to
    reseeded: dict[int, int] = field(default_factory=dict)  # step -> prompt seed of its retry (skip_batch)
    last: Snapshot | None = None

    @classmethod
    def from_state(cls, settings: RollbackSettings, seed: int, state: dict | None) -> Rollback:
        state = state or {}
        return cls(
            settings,
            seed,
            count=int(state.get("count", 0)),
            events=list(state.get("events", [])),
            lr_scale=float(state.get("lr_scale", 1.0)),
            precision=state.get("precision"),
            reseeded={int(k): int(v) for k, v in state.get("reseeded", {}).items()},
        )

    def state(self) -> dict:
        """What a resume point's meta carries (JSON)."""
        return {
            "count": self.count,
            "events": self.events,
            "lr_scale": self.lr_scale,
            "precision": self.precision,
            "reseeded": {str(k): v for k, v in self.reseeded.items()},
        }

    def step_seed(self, step: int) -> int:
        """The seed ``RLStep`` runs 0-based ``step`` with: the run's, or the retry seed skip_batch gave it."""
        return self.reseeded.get(step, self.seed)

    def due(self, step: int, checkpoint_every: int) -> bool:
        """Snapshot after ``step`` steps? Every ``every`` steps, and at each resume point, so a rollback never
        goes behind a committed one (replaying it would commit that step again)."""
        if self.last is None:
            return True
        if step == self.last.step:
            return False
        return step - self.last.step >= self.settings.every or step % checkpoint_every == 0

    def snapshot(self, step: int, optimizer, loop: Any) -> Snapshot:
        """Copy the good state after ``step`` steps (weights, optimizer, loop counters, RNG) to the host. An
        optimizer that shards the model (the megatron engine's) copies its own shards (``local_snapshot``):
        no rank ever holds the full model for a snapshot."""
        if hasattr(optimizer, "local_snapshot"):
            self.last = Snapshot(step, {}, {}, {}, loop, torch.get_rng_state(), optimizer.local_snapshot())
            return self.last
        tensors, meta = optimizer.state()
        self.last = Snapshot(
            step,
            {k: _host(v) for k, v in optimizer.master_state_dict().items()},
            {k: v.to("cpu") for k, v in tensors.items()},
            dict(meta),
            loop,
            torch.get_rng_state(),
        )
        return self.last

    def check(self, step: int, metrics: dict[str, Any], runtime=None) -> list[str]:
        """The triggers of 0-based ``step`` (rank 0's, so every rank of a job rolls back together); raises
        when they come with the rollback budget spent."""
        reasons = triggers(self.settings, metrics)
        if runtime is not None:
            reasons = runtime.broadcast(reasons)
        if reasons and self.count >= self.settings.max_rollbacks:
            tried = [f"step {e['step']}: {'; '.join(e['reasons'])}" for e in self.events]
            tried.append(f"step {step + 1}: {'; '.join(reasons)}")
            raise RingzeroError(
                f"rollback: {self.count} rollback(s) spent (max_rollbacks "
                f"{self.settings.max_rollbacks}) and step {step + 1} triggered again; triggers: "
                + " | ".join(tried)
            )
        return reasons

    def roll_back(self, step: int, reasons: list[str], rl) -> Snapshot:
        """Restore the last snapshot into ``rl`` (model, optimizer, engine), record the event, apply the
        remedy."""
        snap = self.last
        if snap is None:
            raise RingzeroError("rollback: no good state to restore (no snapshot taken)")
        self.count += 1
        remedy = self.settings.remedy
        detail = self._remedy(step, rl)
        self.events.append(
            {"step": step + 1, "to_step": snap.step, "reasons": reasons, "remedy": remedy, "detail": detail}
        )
        restore(snap, rl)
        log.warning(
            "rl.rollback",
            step=step + 1,
            to_step=snap.step,
            count=self.count,
            reasons=reasons,
            remedy=remedy,
            detail=detail,
        )
        return snap

    def metrics(self) -> dict[str, Any]:
        e = self.events[-1]
        return {
            "rollback/count": float(self.count),
            "rollback/to_step": float(e["to_step"]),
            "rollback/reason": "; ".join(e["reasons"]),
            "rollback/remedy": e["remedy"],
        }

    def _remedy(self, step: int, rl) -> str:
        remedy = self.settings.remedy
        if remedy == "skip_batch":
            self.reseeded[step] = derive_seed(self.seed, "rollback-skip-batch", step, self.count)
            return f"step {step + 1} resampled with seed {self.reseeded[step]}"
        if remedy == "lower_lr":
            self.lr_scale *= self.settings.lr_factor
            apply_lr_scale(rl.optimizer, rl.base_lr, self.lr_scale)
            return f"peak lr {rl.base_lr * self.lr_scale:.6g} (x{self.lr_scale:g})"
        current, trainer = rl.rollout.policy.name(), rl.cfg.precision.train.name()
        order = ["bf16", *PRECISION_LADDER.values()]
        if current in order and trainer in order and order.index(current) >= order.index(trainer):
            # A rollout above the trainer's policy widens the gap (its numbers move away from the trainer's);
            # at equal policies what is left is kernel order, which no precision switch removes.
            raise RingzeroError(
                f"rollback: remedy raise_precision: the rollout already runs {current!r}, the "
                f"trainer runs {trainer!r}; a higher rollout precision would not bring them closer "
                "(use skip_batch or lower_lr, or a looser rollback.on threshold)"
            )
        target = PRECISION_LADDER.get(current)
        if target is None:
            raise RingzeroError(
                f"rollback: remedy raise_precision has no policy above the rollout's {current!r} "
                f"(ladder: {' -> '.join(['bf16', *PRECISION_LADDER.values()])})"
            )
        self.precision = target
        rl.rebuild_rollout(target)
        return f"rollout precision {current} -> {target}"


def apply_lr_scale(optimizer, base_lr: float, scale: float) -> None:
    optimizer.settings = optimizer.settings.model_copy(update={"lr": base_lr * scale})


def restore(snap: Snapshot, rl) -> None:
    """Put the snapshot's weights and optimizer state back, bit for bit, and serve them."""
    if snap.local is not None:
        rl.optimizer.restore_local(snap.local)
    else:
        rl.optimizer.load_weights(snap.weights, source=f"rollback snapshot (step {snap.step})")
        rl.optimizer.load_state({k: v.clone() for k, v in snap.optim_tensors.items()}, snap.optim_meta)
    torch.set_rng_state(snap.rng)
    rl.push(snap.step - 1)  # the engine serves the restored weights, under the version they had


def guard_for(settings: RollbackSettings | None, rl) -> Rollback | None:
    """The stage's guard (None when ``settings`` is), with the remedies of a resumed attempt applied again."""
    if settings is None:
        return None
    guard = Rollback.from_state(settings, rl.cfg.run.seed, rl.resumed.get("rollback"))
    if guard.lr_scale != 1.0:
        apply_lr_scale(rl.optimizer, rl.base_lr, guard.lr_scale)
    if guard.precision is not None:
        rl.rebuild_rollout(guard.precision)
        rl.push(rl.first_step - 1)
    return guard
