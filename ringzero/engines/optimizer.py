"""The optimizer every training stage shares: AdamW on fp32 master weights, lr schedule, clipping, skips.

- Master weights: a model whose body runs in bf16 keeps an fp32 copy of every parameter; AdamW updates
  the copy and the model receives it cast back. Updating bf16 parameters in place would round away any
  step smaller than ~1/256 of the weight, which is most RL steps at small learning rates. An fp32 model
  is its own master (no copy).
- Schedule: linear warmup over ``warmup_steps``, then ``cosine`` decay to ``MIN_LR_FRACTION`` of the peak
  at ``total_steps`` (pretraining) or ``constant`` (RL, as the paper).
- Non-finite guard: a step whose gradient norm is not finite never reaches the weights; it is counted
  and reported, and the moments stay untouched.
- State for resume: plain tensors plus a JSON-able dict (no pickle), see ``state()`` / ``load_state()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ringzero.errors import RingzeroError
from ringzero.parallel.grads import sync_grads

MIN_LR_FRACTION = 0.1
"""Cosine decay ends at this fraction of the peak lr rather than zero: the last steps still learn."""

Schedule = Literal["cosine", "constant"]


def lr_at(step: int, peak: float, warmup_steps: int, total_steps: int, schedule: Schedule) -> float:
    """Learning rate of 0-based optimizer step ``step``."""
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class StepReport:
    lr: float
    grad_norm: float
    skipped: bool


class TrainOptimizer:
    """``zero_grad()``, ``loss.backward()``, ``step()`` over ``model``; see the module docstring.

    ``settings`` is an ``OptimSettings`` (lr, warmup_steps, weight_decay, grad_clip, betas).
    """

    def __init__(self, model: nn.Module, settings, total_steps: int, schedule: Schedule = "cosine"):
        self.model, self.settings = model, settings
        self.total_steps, self.schedule = total_steps, schedule
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.needs_master = any(p.dtype != torch.float32 for p in self.params)
        self.master = (
            [p.detach().float().clone().requires_grad_(True) for p in self.params]
            if self.needs_master
            else self.params
        )
        # Norm gains stay out of weight decay: decaying them towards 0 shrinks activations, not complexity.
        decay = [m for m in self.master if m.dim() >= 2]
        no_decay = [m for m in self.master if m.dim() < 2]
        self.adam = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": settings.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=settings.lr,
            betas=tuple(settings.betas),
        )
        self.steps_taken = 0  # optimizer steps applied or skipped: the schedule's clock
        self.skipped = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        if self.needs_master:
            for m in self.master:
                m.grad = None

    def reduce_grads(self, groups) -> None:
        """Sum the gradients over the ``dp_cp`` ranks (``ringzero.parallel.grads.sync_grads``)."""
        sync_grads(self.model.parameters(), groups)

    def step(self) -> StepReport:
        """Clip, check and apply the accumulated gradients; the schedule advances either way."""
        lr = lr_at(
            self.steps_taken, self.settings.lr, self.settings.warmup_steps, self.total_steps, self.schedule
        )
        self.steps_taken += 1
        if self.needs_master:
            for p, m in zip(self.params, self.master, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
        norm = self.clip_grads([m for m in self.master if m.grad is not None])
        if not math.isfinite(norm):
            self.skipped += 1
            self.zero_grad()
            return StepReport(lr, norm, skipped=True)
        for group in self.adam.param_groups:
            group["lr"] = lr
        self.adam.step()
        if self.needs_master:
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    p.copy_(m)
        self.zero_grad()
        return StepReport(lr, norm, skipped=False)

    def clip_grads(self, grads: list[torch.Tensor]) -> float:
        """Clip ``grads`` to ``grad_clip`` by their global norm; returns the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(grads, self.settings.grad_clip)) if grads else 0.0

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Put full weights under the model's own names into the model and its fp32 masters (the given
        values, not their casts to the body dtype)."""
        from ringzero.model.weights import load_weights_

        load_weights_(self.model, state, source=source)
        if self.needs_master:
            names = {id(p): n for n, p in self.model.named_parameters()}
            with torch.no_grad():
                for p, m in zip(self.params, self.master, strict=True):
                    m.copy_(state[names[id(p)]].to(m.dtype))

    def master_state_dict(self, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """The model's state dict with fp32 master values: what checkpoints and weight pushes carry. Every
        rank holds the whole model here, so ``everywhere`` (False: only rank 0 needs it) changes nothing."""
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        if self.needs_master:
            names = {id(p): n for n, p in self.model.named_parameters()}
            for p, m in zip(self.params, self.master, strict=True):
                state[names[id(p)]] = m.detach()
        return state

    # -- resume ------------------------------------------------------------------------------------

    def state(self, everywhere: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
        """``(tensors, meta)``: Adam moments and step counts per parameter index, master weights, counters
        (``everywhere`` as for ``master_state_dict``)."""
        sd = self.adam.state_dict()
        tensors = {}
        for idx, slots in sd["state"].items():
            for key, value in slots.items():
                tensors[f"adam.{idx}.{key}"] = torch.as_tensor(value).detach().clone()
        if self.needs_master:
            tensors.update({f"master.{i}": m.detach().clone() for i, m in enumerate(self.master)})
        meta = {"steps_taken": self.steps_taken, "skipped": self.skipped, "n_params": len(self.master)}
        return tensors, meta

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        if meta.get("n_params") != len(self.master):
            raise RingzeroError(
                f"optimizer state holds {meta.get('n_params')} parameters, this model has {len(self.master)}"
            )
        sd = self.adam.state_dict()
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in tensors.items():
            kind, idx, *rest = name.split(".")
            if kind == "adam":
                state.setdefault(int(idx), {})[rest[0]] = value
        sd["state"] = state
        self.adam.load_state_dict(sd)
        if self.needs_master:
            with torch.no_grad():
                for i, (p, m) in enumerate(zip(self.params, self.master, strict=True)):
                    m.copy_(tensors[f"master.{i}"])
                    p.copy_(m)
        self.steps_taken, self.skipped = int(meta["steps_taken"]), int(meta["skipped"])
