"""Gates: named thresholds over a stage's summary; all must hold for the run to go on."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ringzero.config.gates import Threshold


@dataclass(frozen=True)
class GateResult:
    passed: bool  # a plain bool: pipeline conditions compare it directly
    reasons: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate_gate(thresholds: list[Threshold], summary: dict[str, float]) -> GateResult:
    reasons = []
    passed = True
    for t in thresholds:
        ok, reason = t.check(summary)
        passed = passed and ok
        reasons.append(("pass: " if ok else "FAIL: ") + reason)
    return GateResult(passed=bool(passed), reasons=reasons or ["no gate configured"])
