"""Typed task settings; ``kind`` selects the task family."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ringzero.config.base import StrictModel


class ArithmeticTask(StrictModel):
    """Synthetic arithmetic with difficulty knobs and an optional worked-trace format."""

    kind: Literal["arithmetic"] = "arithmetic"
    operation: Literal["add", "mul", "parity"] = "add"
    digits: int = Field(10, ge=1, le=64, description="operand digits (bits for parity)")
    operands: int = Field(2, ge=2, le=8)
    trace_fraction: float = Field(0.05, ge=0.0, le=1.0, description="share of corpus documents with worked traces")
    direct_noise: float = Field(0.5, ge=0.0, le=1.0, description="share of direct answers in the corpus that are wrong")
    eval_prompts: int = Field(128, ge=1, description="held-out prompts for evaluation")


class JsonlTask(StrictModel):
    """A user dataset of JSONL lines with ``question`` and ``answer`` (GSM8K-style)."""

    kind: Literal["jsonl"] = "jsonl"
    train_path: str = Field(..., description="JSONL file of training prompts")
    eval_path: str | None = Field(None, description="JSONL file of held-out prompts")
    question_field: str = "question"
    answer_field: str = "answer"


TaskConfig = Annotated[ArithmeticTask | JsonlTask, Field(discriminator="kind")]
