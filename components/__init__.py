"""The pipeline's lightweight components, built for one step image."""

from __future__ import annotations

from dataclasses import dataclass

from kfp import dsl

from components.gate import gate
from components.stages import eval_stage, lm_stage, rl_stage
from components.status import record_status


@dataclass(frozen=True)
class Components:
    stages: dict  # stage kind -> component
    gate: object
    record_status: object


def make_components(base_image: str) -> Components:
    """Components running in ``base_image``, which already has ringzero and kfp: steps install nothing."""

    def build(func):
        return dsl.component(func, base_image=base_image, install_kfp_package=False)

    lm = build(lm_stage)
    return Components(
        stages={"pretrain": lm, "rl": build(rl_stage), "distill": lm, "eval": build(eval_stage)},
        gate=build(gate),
        record_status=build(record_status),
    )
