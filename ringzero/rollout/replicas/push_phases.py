"""The phases of one weight push over some replicas, run concurrently across them:

``/pause_generation`` on all, [``/begin_weight_update`` on all], the update, [``/end_weight_update``], then
``/continue_generation`` on the replicas that paused, after a failure too. Servers without pause
(``ringzero serve``) or without weight-update sessions (SGLang before mid-2026) answer 404 there, and that
phase is skipped for them.

The update is one of two kinds, and the kind says which phases it runs in:

- ``EachReplica(fn)``: ``fn(client)`` on every replica (a model folder each loads), no session;
- ``OneBroadcast(fn)``: ``fn()`` once, reaching every replica itself (a torch.distributed broadcast), inside a
  weight-update session on the servers that have one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ringzero.rollout.replicas.fan_out import Failed, attempt, each, raise_any
from ringzero.rollout.types import ServerClient


@dataclass(frozen=True)
class EachReplica:
    update: Callable[[ServerClient], object]


@dataclass(frozen=True)
class OneBroadcast:
    update: Callable[[], object]


def push_phases(clients: list[ServerClient], version: str, update: EachReplica | OneBroadcast) -> None:
    every = [(c,) for c in clients]
    paused: list[ServerClient] = []
    try:
        answers = attempt(lambda c: c.pause_generation(), every, f"pause before push {version!r}")
        paused = [c for c, a in zip(clients, answers, strict=True) if a is True]
        raise_any([a.exc for a in answers if isinstance(a, Failed)])
        if isinstance(update, EachReplica):
            each(update.update, every, f"weight push {version!r}")
            return
        begun = each(lambda c: c.begin_weight_update(), every, f"begin push {version!r}")
        update.update()
        ended = [(c,) for c, ok in zip(clients, begun, strict=True) if ok]
        if ended:
            each(lambda c: c.end_weight_update(), ended, f"end push {version!r}")
    finally:
        if paused:
            each(
                lambda c: c.continue_generation(), [(c,) for c in paused], f"continue after push {version!r}"
            )
