"""``parallelize(model, groups, plan)``: apply context parallelism to single-device model code.

The model's attention modules keep doing all per-token work (projections, norms, RoPE at the global
positions they are given); only their ``.core`` is replaced by the CP core of the strategy the plan
names for their layer type, built with the replaced core's attention impl (``MLACore.impl``, from
``model.mla_attention_impl``), so a layer configured for ``sdpa`` keeps it where the CP core can. Every
layer is checked first, and a pairing that cannot work is refused with its reason before anything is
changed. With ``cp == 1`` the model is left as it is.

What the caller still owes a CP training step (see ``grads.py``): feed each rank its shard of tokens
with their global positions (``SeqLayout``), normalise the loss by the global token count, and sum the
gradients of replicated weights over the data- and context-parallel ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from ringzero.errors import RingzeroError
from ringzero.model.lightning import LightningAttention
from ringzero.model.mla import MLAttention
from ringzero.parallel.comm import CommLedger
from ringzero.parallel.config import CPPlan
from ringzero.parallel.dims import ParallelGroups
from ringzero.parallel.sharding import chunks_per_rank
from ringzero.parallel.strategies import STRATEGIES, refusal

_LAYER_CLASSES: dict[type, str] = {MLAttention: "mla", LightningAttention: "lightning"}


def attention_layers(model: nn.Module) -> list[tuple[str, str, nn.Module]]:
    """``(module name, layer type, module)`` of every attention module with a swappable core."""
    found = []
    for name, module in model.named_modules():
        for cls, layer_type in _LAYER_CLASSES.items():
            if isinstance(module, cls):
                found.append((name or "<root>", layer_type, module))
    return found


def core_impl(module: nn.Module) -> str:
    """The attention impl of the core about to be replaced (``MLACore.impl``; ``explicit`` when it has
    none)."""
    return getattr(module.core, "impl", "explicit")


def plan_dict(plan: CPPlan | Mapping[str, str] | None) -> dict[str, str]:
    if plan is None:
        plan = CPPlan()
    if isinstance(plan, CPPlan):
        return plan.model_dump()
    return dict(plan)


def check_plan(
    model: nn.Module, cp: int, plan: CPPlan | Mapping[str, str] | None = None, sharding: str = "contiguous"
) -> list[str]:
    """Every reason the plan cannot be applied to ``model`` at CP degree ``cp`` (empty when it can)."""
    chunks_per_rank(sharding)
    strategies = plan_dict(plan)
    problems = []
    for name, layer_type, module in attention_layers(model):
        strategy = strategies.get(layer_type)
        if strategy is None:
            problems.append(f"{name}: the plan names no strategy for {layer_type} layers")
            continue
        why = refusal(layer_type, strategy, module.num_attention_heads, cp, sharding)
        if why:
            problems.append(f"{name} ({layer_type}, {strategy}): {why}")
    return problems


def parallelize(
    model: nn.Module,
    groups: ParallelGroups,
    plan: CPPlan | Mapping[str, str] | None = None,
    sharding: str = "contiguous",
    ledger: CommLedger | None = None,
) -> CommLedger:
    """Swap every attention core for its CP core (in place). Returns the ledger the cores book into.

    ``plan`` maps layer type to strategy (default: MLA -> ``a2a``, Lightning -> ``allgather``);
    ``sharding`` must match how the caller shards the tokens (``SeqLayout.mode``)."""
    ledger = ledger if ledger is not None else CommLedger()
    cp = groups.dims.cp
    if cp == 1:
        return ledger
    problems = check_plan(model, cp, plan, sharding)
    if problems:
        raise RingzeroError("cannot apply context parallelism:\n" + "\n".join(f"  - {p}" for p in problems))
    strategies = plan_dict(plan)
    for _, layer_type, module in attention_layers(model):
        strategy = STRATEGIES[(layer_type, strategies[layer_type])]
        module.core = strategy.build(groups.cp, ledger, sharding, core_impl(module))
    return ledger
