"""What a decoded row comes back as, and how rows become a request's ``Completion``s.

Shared by the static groups of ``EmbeddedEngine.generate`` and the continuous batch
(``ringzero.rollout.engine.continuous``), so both answer alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringzero.rollout.engine.logprob_extras import PromptLogprobs, TopK
from ringzero.rollout.engine.rows import Finished, RowSpec
from ringzero.rollout.engine.stopping import LENGTH
from ringzero.rollout.types import Completion, GenerateRequest

ABORT = "abort"
ABORTED_BEFORE_PREFILL = "Abort before prefill"  # SGLang's message for a request aborted while queued
ABORTED = "Aborted"


@dataclass
class Done:
    """A row's outcome plus what ``Finished`` does not carry: top-k alternatives, abort message, experts."""

    result: Finished
    top: list[TopK] | None = None
    abort_message: str | None = None
    routing: torch.Tensor | None = None  # [fed tokens, MoE layers, K] on the device, when the row asked


def cut(f: Finished, row: RowSpec) -> bool:
    """An aborted row that ended at its abort, before its own cap: it finishes ``abort`` (set here)."""
    if f.reason == LENGTH and len(f.output_ids) < row.max_new:
        f.reason = ABORT
        return True
    return False


def completions(
    requests: Sequence[GenerateRequest],
    rows: Sequence[RowSpec],
    done: Sequence[Done],
    prompts: dict[int, PromptLogprobs],
    experts: Sequence,
    weight_version: str,
) -> list[list[Completion]]:
    """``n`` completions per request, in request order, from its rows' outcomes."""
    out: list[list[Completion]] = [[] for _ in requests]
    for row, d, routing in zip(rows, done, experts, strict=True):
        meta = {"rid": row.rid} if row.rid is not None else {}
        if d.abort_message is not None:
            meta["message"] = d.abort_message
        f, scored = d.result, prompts.get(row.request)
        out[row.request].append(
            Completion(
                prompt_ids=list(row.prompt),
                output_ids=f.output_ids,
                output_logprobs=f.logprobs,
                finish_reason=f.reason,
                matched_stop=f.matched,
                weight_version=weight_version,
                meta=meta,
                output_top_logprobs=d.top if requests[row.request].logprobs.top_k else None,
                prompt_logprobs=scored.values if scored else None,
                prompt_top_logprobs=scored.top if scored else None,
                routed_experts=routing,
            )
        )
    return out
