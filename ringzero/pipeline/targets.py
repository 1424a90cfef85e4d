"""Targets checked against what a run left: stage summaries, per-step metrics, wall time.

A target whose value cannot be read (a stage that did not run, a key its summary lacks, a NaN) is
"missing", never "met". Targets never change a run's status or exit code: they are reported only.
"""

from __future__ import annotations

import math
import operator
from dataclasses import asdict, dataclass, field

from ringzero.config.targets import RUN, Ref, Target, Term

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
MET, MISSED, MISSING = "met", "missed", "missing"


@dataclass(frozen=True)
class TargetResult:
    name: str
    expr: str
    left: float | None
    right: float | None
    status: str  # met | missed | missing
    missing: list[str] = field(default_factory=list)  # the refs that had no value

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunValues:
    """What targets read: ``summaries`` and ``steps`` (step -> metric record) per stage name."""

    summaries: dict[str, dict] = field(default_factory=dict)
    steps: dict[str, dict[int, dict]] = field(default_factory=dict)
    wall_minutes: float | None = None

    @classmethod
    def of_stages(cls, cfg, stages) -> RunValues:
        """From the run's ``ExecutedStage`` list; the wall time only once every configured stage is there
        (a run stopped by a gate has not spent what the whole run would)."""
        steps = {}
        for ex in stages:
            merged: dict[int, dict] = {}
            for record in ex.metrics:  # a later record of a step wins, as the metric reader merges them
                merged.setdefault(int(record["step"]), {}).update(record)
            steps[ex.name] = merged
        reached = {ex.name for ex in stages}
        whole = all(s.name in reached for s in cfg.stages)
        wall = sum(float(ex.outcome.wall_s) for ex in stages) / 60 if whole else None
        return cls({ex.name: dict(ex.outcome.summary) for ex in stages}, steps, wall)

    def lookup(self, ref: Ref) -> float | None:
        if ref.stage == RUN:
            value = self.wall_minutes if ref.key == "wall_minutes" else None
        elif ref.step is not None:
            value = self.steps.get(ref.stage, {}).get(ref.step, {}).get(ref.key)
        else:
            value = self.summaries.get(ref.stage, {}).get(ref.key)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return None
        return float(value)


def _value(term: Term, values: RunValues) -> float | None:
    if term.ref is None:
        return term.offset
    got = values.lookup(term.ref)
    return None if got is None else term.scale * got + term.offset


def evaluate_targets(targets: list[Target], values: RunValues) -> list[TargetResult]:
    out = []
    for t in targets:
        left, right = _value(t.left, values), _value(t.right, values)
        missing = [str(r) for r in t.refs() if values.lookup(r) is None]
        if left is None or right is None:
            status = MISSING
        else:
            status = MET if _OPS[t.op](left, right) else MISSED
        out.append(TargetResult(t.name, t.expr, left, right, status, missing))
    return out


def run_targets(cfg, stages) -> list[TargetResult]:
    """The run's targets over its executed stages (those a gate kept from running are missing)."""
    return evaluate_targets(list(cfg.targets), RunValues.of_stages(cfg, stages))
