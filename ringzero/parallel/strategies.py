"""The context-parallel strategies, the layer type each one serves, and why any other pairing is refused.

A strategy builds the CP core that replaces a layer's single-device ``.core``, given the CP group, the
comm ledger, the sharding and that core's attention impl (``MLACore.impl``: ``explicit`` | ``sdpa``;
``explicit`` for cores without one). Only ``a2a`` uses the impl: the MLA ring needs the explicit
function's log-sum-exp, and Lightning has no softmax. ``refusal`` returns the reason a (layer type,
strategy, layout) combination cannot work, or ``None``; ``parallelize`` calls it for every layer before
touching the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ringzero.parallel.comm import CommLedger
from ringzero.parallel.lightning_cp import LightningAllGatherCore, LightningRingCore
from ringzero.parallel.mla_cp import MLAAllToAllCore, MLARingCore, check_heads

LAYER_TYPES = ("mla", "lightning")


@dataclass(frozen=True)
class Strategy:
    name: str
    layer_type: str
    summary: str
    # (cp group, ledger, sharding, attention impl of the replaced core; "explicit" if left out) -> core
    build: Callable[[object, CommLedger, str, str], nn.Module]
    extra_check: Callable[[int, int, str], str | None] = lambda num_attention_heads, cp, sharding: None


def _lightning_ring_check(num_attention_heads: int, cp: int, sharding: str) -> str | None:
    if sharding != "contiguous":
        return (
            f"the Lightning ring (LASP-1) hands the state from rank p to p+1 along the sequence, which "
            f"needs contiguous shards; {sharding} shards are not in sequence order (use 'allgather')"
        )
    return None


STRATEGIES: dict[tuple[str, str], Strategy] = {
    ("mla", "a2a"): Strategy(
        "a2a",
        "mla",
        "all-gather the latent, all-to-all queries to head shards and outputs back",
        lambda group, ledger, sharding, impl="explicit": MLAAllToAllCore(group, ledger, impl),
        lambda num_attention_heads, cp, sharding: check_heads(num_attention_heads, cp),
    ),
    ("mla", "ring"): Strategy(
        "ring",
        "mla",
        "materialised K/V around the ring, log-sum-exp merge",
        lambda group, ledger, sharding, impl="explicit": MLARingCore(group, ledger, sharding),
    ),
    ("lightning", "allgather"): Strategy(
        "allgather",
        "lightning",
        "one all-gather of chunk states, decayed prefix sum (LASP-2)",
        lambda group, ledger, sharding, impl="explicit": LightningAllGatherCore(group, ledger, sharding),
    ),
    ("lightning", "ring"): Strategy(
        "ring",
        "lightning",
        "state handed from rank to rank, P-1 hops (LASP-1)",
        lambda group, ledger, sharding, impl="explicit": LightningRingCore(group, ledger),
        _lightning_ring_check,
    ),
}

_WHY_NOT = {
    ("lightning", "a2a"): "a2a moves MLA's head-independent latent; Lightning layers keep a recurrent state "
    "instead, which 'allgather' or 'ring' pass between ranks",
    ("mla", "allgather"): "allgather exchanges the fixed-size recurrent state of linear attention; softmax "
    "attention has no such state (use 'a2a' or 'ring')",
}


def strategy_names(layer_type: str) -> list[str]:
    return sorted(name for (lt, name) in STRATEGIES if lt == layer_type)


def refusal(layer_type: str, strategy: str, num_attention_heads: int, cp: int, sharding: str) -> str | None:
    """Why ``strategy`` cannot serve this layer, or ``None`` when it can."""
    if layer_type not in LAYER_TYPES:
        return f"unknown layer type {layer_type!r} (known: {', '.join(LAYER_TYPES)})"
    found = STRATEGIES.get((layer_type, strategy))
    if found is None:
        why = _WHY_NOT.get((layer_type, strategy), "no such strategy")
        return (
            f"strategy {strategy!r} does not support {layer_type} layers: {why}; "
            f"{layer_type} supports {', '.join(strategy_names(layer_type))}"
        )
    return found.extra_check(num_attention_heads, cp, sharding)
