"""The work items the engine scheduler's queue carries: a generate batch, a call on the engine, the stop
sentinel. A leaf module: the scheduler and its continuous-batching loop both read them."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ringzero.rollout.types import GenerateRequest


@dataclass(eq=False)
class GenerateJob:
    requests: list[GenerateRequest]
    future: Future = field(default_factory=Future)
    aborted: set[int] = field(default_factory=set)  # indices into ``requests``
    messages: dict[int, str] = field(default_factory=dict)  # the client's abort message, by index
    started: bool = False  # taken into an engine batch (under the scheduler's lock)


@dataclass
class CallJob:
    fn: Callable[[Any], Any]
    future: Future = field(default_factory=Future)


STOP = object()
