"""Completion records -> SGLang's ``/generate`` items and OpenAI legacy completion responses.

SGLang keeps the stop token or stop string in ``output_ids`` and trims it from ``text`` (unless
``no_stop_trim``); ``meta_info.finish_reason`` is ``{"type": "stop", "matched": id_or_str}`` or
``{"type": "length", "length": n}``. Log-probs are ``[logprob, token_id, text_or_null]`` per output
token. JSON has no infinity: a log-prob of -inf is sent as null, as SGLang's orjson does.
"""

from __future__ import annotations

import math
import time
import uuid

from ringzero.rollout.server_schema import TextOptions
from ringzero.rollout.types import Completion


class EngineCrash(Exception):
    """The engine failed on input it did not refuse, or answered out of contract: an HTTP 500."""


def finish_reason(c: Completion) -> dict:
    if c.finish_reason == "length":
        return {"type": "length", "length": len(c.output_ids)}
    if c.finish_reason == "stop":
        return {"type": "stop", "matched": c.matched_stop}
    return {"type": "abort", "message": str(c.meta.get("message", "aborted by the engine"))}


def completion_text(c: Completion, tokenizer, opts: TextOptions) -> str:
    ids = list(c.output_ids)
    trim = c.finish_reason == "stop" and not opts.no_stop_trim
    if trim and isinstance(c.matched_stop, int) and ids and ids[-1] == c.matched_stop:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special=opts.skip_special_tokens)
    if trim and isinstance(c.matched_stop, str) and c.matched_stop:
        cut = text.find(c.matched_stop)
        if cut != -1:
            text = text[:cut]
    return text


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def token_logprobs(c: Completion, tokenizer, with_text: bool) -> list[list]:
    if len(c.output_logprobs) != len(c.output_ids):
        raise EngineCrash(
            f"engine returned {len(c.output_logprobs)} log-probs for {len(c.output_ids)} output tokens"
        )
    return [
        [_json_float(lp), int(tid), tokenizer.decode([tid], skip_special=False) if with_text else None]
        for lp, tid in zip(c.output_logprobs, c.output_ids, strict=True)
    ]


def generate_item(c: Completion, rid: str, tokenizer, opts: TextOptions, *, return_logprob: bool,
                  text_in_logprobs: bool, e2e_latency: float) -> dict:
    meta = {
        "id": rid,
        "finish_reason": finish_reason(c),
        "prompt_tokens": len(c.prompt_ids),
        "completion_tokens": len(c.output_ids),
        "cached_tokens": 0,
        "weight_version": str(c.weight_version),
        "e2e_latency": e2e_latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = token_logprobs(c, tokenizer, text_in_logprobs)
    return {"text": completion_text(c, tokenizer, opts), "output_ids": [int(t) for t in c.output_ids],
            "meta_info": meta}


def sample_ids(rid: str | None, n: int) -> list[str]:
    """Response ids of a prompt's samples. SGLang gives each of ``n > 1`` samples a fresh id."""
    if n == 1:
        return [rid or uuid.uuid4().hex]
    return [uuid.uuid4().hex for _ in range(n)]


def _openai_logprobs(c: Completion, tokenizer) -> dict:
    if len(c.output_logprobs) != len(c.output_ids):
        raise EngineCrash(
            f"engine returned {len(c.output_logprobs)} log-probs for {len(c.output_ids)} output tokens"
        )
    # text_offset: where each token starts in the choice's text (SGLang sends -1 here).
    tokens, offsets, at = [], [], 0
    for tid in c.output_ids:
        piece = tokenizer.decode([tid], skip_special=False)
        tokens.append(piece)
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": [_json_float(lp) for lp in c.output_logprobs],
        # The engine keeps no top-k alternatives; OpenAI's schema allows null here.
        "top_logprobs": None,
        "text_offset": offsets,
    }


def openai_completion(groups: list[list[Completion]], tokenizer, opts: TextOptions, *, model: str,
                      logprobs: bool, return_token_ids: bool) -> dict:
    """Choices in prompt-major order (prompt i's samples at ``i * n + j``), as SGLang numbers them."""
    choices = []
    flat = [c for group in groups for c in group]
    for index, c in enumerate(flat):
        reason = finish_reason(c)
        choice = {
            "index": index,
            "text": completion_text(c, tokenizer, opts),
            "logprobs": _openai_logprobs(c, tokenizer) if logprobs else None,
            "finish_reason": reason["type"],
            "matched_stop": reason.get("matched"),
        }
        if return_token_ids:
            choice["token_ids"] = [int(t) for t in c.output_ids]
        choices.append(choice)
    prompt_tokens = sum(len(group[0].prompt_ids) for group in groups if group)
    completion_tokens = sum(len(c.output_ids) for c in flat)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "metadata": {"weight_version": str(flat[0].weight_version) if flat else None},
    }
