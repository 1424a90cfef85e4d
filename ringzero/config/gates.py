"""Threshold expressions such as ``ratio/p99 <= 0.05``: used for gates between stages and stop conditions."""

from __future__ import annotations

import math
import operator
import re
from typing import Annotated

from pydantic import BeforeValidator, PlainSerializer

from ringzero.strict_model import StrictModel

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
_PATTERN = re.compile(r"^\s*([A-Za-z0-9_./@-]+)\s*(<=|>=|==|<|>)\s*([-+0-9.eE]+|inf|-inf)\s*$")


class Threshold(StrictModel):
    metric: str
    op: str
    value: float

    def check(self, metrics: dict[str, float]) -> tuple[bool, str]:
        """(passed, reason). A missing or non-finite metric fails with that reason."""
        if self.metric not in metrics:
            return False, f"{self.metric} missing from the summary (wanted {self}) "
        got = float(metrics[self.metric])
        if math.isnan(got):
            return False, f"{self.metric} is NaN (wanted {self})"
        ok = _OPS[self.op](got, self.value)
        return ok, f"{self.metric} = {got:.6g} {'satisfies' if ok else 'violates'} {self}"

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


def parse_threshold(v):
    if isinstance(v, Threshold):
        return v
    if isinstance(v, dict):
        return Threshold.model_validate(v)
    if not isinstance(v, str):
        raise ValueError(f"expected a string like 'ratio/p99 <= 0.05' (got {v!r})")
    m = _PATTERN.match(v)
    if not m:
        raise ValueError(f"cannot parse {v!r}; expected 'METRIC OP NUMBER' with OP one of <= < >= > ==")
    return Threshold(metric=m.group(1), op=m.group(2), value=float(m.group(3)))


ThresholdExpr = Annotated[Threshold, BeforeValidator(parse_threshold), PlainSerializer(str, return_type=str)]
