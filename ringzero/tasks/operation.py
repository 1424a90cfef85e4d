"""The contract each synthetic operation fulfils for ``SyntheticArithmetic`` and the corpus generator.

An *instance* is the operation's own immutable description of one problem (a tuple of ints). Each
operation renders it as a question, a direct answer and a worked trace in two forms: ``verbose``
restates the arithmetic of every step, ``terse`` keeps only what the next step needs. Both check as
correct, so self-distillation can move from the first to the second without leaving the format.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from ringzero.tasks.base import StepCheck

Instance = tuple[int, ...]


class Operation(ABC):
    name: str

    @abstractmethod
    def sample(self, rng: random.Random) -> Instance: ...

    @abstractmethod
    def key(self, instance: Instance) -> str:
        """A canonical string naming the instance: the basis of the train/eval split."""

    @abstractmethod
    def question(self, instance: Instance) -> str: ...

    @abstractmethod
    def answer(self, instance: Instance) -> str: ...

    @abstractmethod
    def trace_steps(self, instance: Instance, verbose: bool) -> list[str]:
        """The steps of a correct worked trace, in order."""

    @abstractmethod
    def wrong_answer(self, instance: Instance, rng: random.Random) -> str:
        """A plausible answer that is not the correct one: the noise of web text."""

    @abstractmethod
    def check_steps(self, body: str, instance: Instance | None) -> StepCheck:
        """Parse a trace body and count the steps that hold; with ``instance`` they must also use its
        inputs."""

    @abstractmethod
    def drill(self, rng: random.Random) -> str:
        """One single-step fact in the trace's notation (drill documents list several)."""

    def lookup_drill(self, instance: Instance, rng: random.Random) -> str:
        """The instance's labelled inputs, then read back by label: the lookup every trace step makes."""
        raise NotImplementedError(f"{self.name} has no labelled inputs to look up")

    @abstractmethod
    def meta(self, instance: Instance) -> Mapping[str, Any]:
        """What ``instance_from_meta`` needs to rebuild the instance from a ``Problem``."""

    @abstractmethod
    def instance_from_meta(self, meta: Mapping[str, Any]) -> Instance: ...
