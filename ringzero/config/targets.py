"""Targets: what a run should reach, checked once it ends and reported as met, missed or missing.

Unlike a gate, a target never stops a run: it reads any stage's numbers, or the run's, so it can say how a
stage compares with another (``distill is 30% shorter than stage 1``), which no single stage can know.

A target is ``TERM OP TERM`` with OP one of ``<= < >= > ==``; a TERM is ``NUMBER`` or
``[NUMBER *] REF [(+|-) NUMBER]`` (the sign of an offset needs a space before it: keys hold ``-``). A REF is

- ``<stage>.<summary key>``: that stage's summary (``eval.compare/stage2/accuracy``, ``stage1.len/mean``);
- ``<stage>.<metric key>@step<N>``: the metric at step N of the stage's metrics records
  (``stage1.len/mean@step5``), for a curve's early value, which a summary (the last steps) does not keep;
- ``run.wall_minutes``: the stages' wall time summed over the run, a cached stage counting the wall time it
  recorded when it ran; missing until every configured stage has an outcome.

The items of ``targets:`` are a string (named by itself) or ``{name, expr}``. Targets are not part of any
stage's identity: adding one reruns nothing.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from ringzero.strict_model import StrictModel

RUN = "run"
"""The REF head of run-wide values (no stage may take this name in a REF)."""
RUN_KEYS = ("wall_minutes",)

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_KEY = r"[A-Za-z0-9_./@-]+"
_OP = re.compile(r"<=|>=|==|<|>")
_NUMBER_TERM = re.compile(rf"^\s*({_NUM})\s*$")
_REF_TERM = re.compile(
    rf"^\s*(?:({_NUM})\s*\*\s*)?([a-z0-9][a-z0-9-]*)\.({_KEY})(?:\s+([+-])\s*({_NUM}))?\s*$"
)
_GLUED_OFFSET = re.compile(rf"[A-Za-z0-9_][-+]{_NUM}$")  # ``len/mean-0.03``: an offset without its space
_AT_STEP = re.compile(r"^(.+)@step(\d+)$")
GRAMMAR = "TERM OP TERM, OP one of <= < >= > ==, TERM = NUMBER or [NUMBER *] STAGE.KEY [(+|-) NUMBER]"


class Ref(StrictModel):
    stage: str  # a stage's name, or "run"
    key: str
    step: int | None = None  # a metric's value at this step instead of the summary's

    def __str__(self) -> str:
        return f"{self.stage}.{self.key}" + ("" if self.step is None else f"@step{self.step}")


class Term(StrictModel):
    """``scale * ref + offset``, or the number ``offset`` alone when there is no ref."""

    scale: float = 1.0
    ref: Ref | None = None
    offset: float = 0.0


class Target(StrictModel):
    name: str
    expr: str  # as written: what the reports show
    left: Term
    op: Literal["<=", "<", ">=", ">", "=="]
    right: Term

    def refs(self) -> list[Ref]:
        return [t.ref for t in (self.left, self.right) if t.ref is not None]


def _term(text: str) -> Term:
    if m := _NUMBER_TERM.match(text):
        return Term(offset=float(m.group(1)))
    m = _REF_TERM.match(text)
    if not m:
        raise ValueError(
            f"cannot parse the term {text.strip()!r}; expected NUMBER or [NUMBER *] STAGE.KEY [(+|-) NUMBER]"
        )
    scale, stage, key, sign, offset = m.groups()
    if _GLUED_OFFSET.search(key):
        raise ValueError(f"{stage}.{key}: put a space before the sign of an offset (keys may hold '-')")
    step = None
    if at := _AT_STEP.match(key):
        key, step = at.group(1), int(at.group(2))
    if stage == RUN and (key not in RUN_KEYS or step is not None):
        raise ValueError(f"{stage}.{key}: the run's values are {', '.join(f'run.{k}' for k in RUN_KEYS)}")
    value = float(offset) if offset is not None else 0.0
    return Term(
        scale=float(scale) if scale is not None else 1.0,
        ref=Ref(stage=stage, key=key, step=step),
        offset=-value if sign == "-" else value,
    )


def parse_expr(expr: str, name: str | None = None) -> Target:
    ops = _OP.findall(expr)
    if len(ops) != 1:
        raise ValueError(f"cannot parse {expr!r}; expected {GRAMMAR}")
    left, right = _OP.split(expr)
    target = Target(
        name=name or expr.strip(), expr=expr.strip(), left=_term(left), op=ops[0], right=_term(right)
    )
    if not target.refs():
        raise ValueError(f"{expr!r} compares two numbers; a target reads at least one STAGE.KEY")
    return target


def parse_target(v) -> Target:
    if isinstance(v, Target):
        return v
    if isinstance(v, str):
        return parse_expr(v)
    if not isinstance(v, dict):
        raise ValueError(f"expected a string like 'eval.eval/accuracy >= 0.9' or {{name, expr}} (got {v!r})")
    unknown = sorted(set(v) - {"name", "expr"})
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; a target is a string or {{name, expr}}")
    for field in ("name", "expr"):
        if not isinstance(v.get(field), str) or not v[field].strip():
            raise ValueError(f"{field}: required, a non-empty string (got {v.get(field)!r})")
    try:
        return parse_expr(v["expr"], v["name"].strip())
    except ValueError as exc:
        raise ValueError(f"expr: {exc}") from None


def _dump(t: Target) -> str | dict:
    # The written form, so a config survives a dump and a load unchanged (the pipeline carries it as JSON).
    return t.expr if t.name == t.expr else {"name": t.name, "expr": t.expr}


TargetExpr = Annotated[
    Target,
    BeforeValidator(parse_target),
    PlainSerializer(_dump),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "description": GRAMMAR},
                {
                    "type": "object",
                    "required": ["name", "expr"],
                    "additionalProperties": False,
                    "properties": {"name": {"type": "string"}, "expr": {"type": "string"}},
                },
            ]
        }
    ),
]


def target_problems(targets: list, stages: list[str]) -> list[str]:
    """Every REF names a stage of the run (or ``run``). Works on the raw items too, so the loader can report
    these alongside field errors; an item that does not parse is left to its field error."""
    problems = []
    for i, item in enumerate(targets):
        try:
            target = parse_target(item)
        except ValueError:
            continue
        for ref in target.refs():
            if ref.stage != RUN and ref.stage not in stages:
                problems.append(
                    f"targets[{i}]: {ref} names no stage of this run (stages: {', '.join(stages)}, or {RUN})"
                )
    return problems
