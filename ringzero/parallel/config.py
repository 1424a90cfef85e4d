"""Typed parallelism settings of a run (validated against the world size when process groups are built)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ringzero.strict_model import StrictModel


class CPPlan(StrictModel):
    """Which context-parallel strategy each layer type uses."""

    mla: Literal["a2a", "ring"] = Field(
        "a2a", description="MLA: all-to-all over heads, or the ring reference"
    )
    lightning: Literal["allgather", "ring"] = Field(
        "allgather", description="Lightning: one AllGather of states (LASP-2), or the ring (LASP-1)"
    )


class ParallelConfig(StrictModel):
    dp: int = Field(1, ge=1, description="data-parallel degree")
    cp: int = Field(1, ge=1, description="context-parallel degree")
    cp_plan: CPPlan = CPPlan()
    sharding: Literal["contiguous", "zigzag"] = Field(
        "contiguous", description="sequence sharding over CP ranks; zigzag balances causal ring work"
    )


def world_product(dp: int, cp: int, tp: int = 1, pp: int = 1) -> tuple[str, str, int]:
    """``("parallel.dp x parallel.cp x engines.training.tp", "2 x 1 x 4", 8)``: the config degrees whose
    product is a job's rank count, for error messages (the megatron degrees only when above 1)."""
    degrees = [("parallel.dp", dp), ("parallel.cp", cp)]
    degrees += [(f"engines.training.{n}", v) for n, v in (("tp", tp), ("pp", pp)) if v > 1]
    return " x ".join(n for n, _ in degrees), " x ".join(str(v) for _, v in degrees), dp * cp * tp * pp


def ep_problem(ep: int, dp: int, cp: int) -> str | None:
    """Expert-parallel ranks are carved out of the data- and context-parallel ranks: ``ep`` divides
    ``dp x cp`` (each group of ep of them holds one copy of the experts), and adds nothing to the world."""
    if ep > 1 and (dp * cp) % ep:
        return (
            f"{ep} does not divide dp x cp ({dp} x {cp} = {dp * cp}): expert-parallel ranks are carved "
            "out of the data- and context-parallel ranks (megatron-core's layout), they do not add to "
            "the world size"
        )
    return None
