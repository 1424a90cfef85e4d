"""Completion records -> SGLang's ``/generate`` items.

SGLang keeps the stop token or stop string in ``output_ids`` and trims it from ``text`` (unless
``no_stop_trim``); ``meta_info.finish_reason`` is ``{"type": "stop", "matched": id_or_str}``,
``{"type": "length", "length": n}`` or ``{"type": "abort", "message", "status_code", "err_type"}``.
Log-probs are ``[logprob, token_id, text_or_null]`` per token (text with ``return_text_in_logprobs``):
``output_token_logprobs`` per output token, ``input_token_logprobs`` per prompt position from
``logprob_start_len`` (the first null); with ``top_logprobs_num`` k, ``output_top_logprobs`` and
``input_top_logprobs`` hold k such triples per position (null at the prompt range's first position).
JSON has no infinity: a log-prob of -inf is sent as null, as SGLang's orjson does.
With ``return_routed_experts``, ``meta_info.routed_experts`` is the base64 of the int32 array
``[seqlen - 1 - start, num_hidden_layers, num_experts_per_tok]``'s bytes (C order, little-endian), as
SGLang's ``tokenizer_manager.py`` / ``detokenizer_manager.py`` encode it (``pybase64.b64encode(
tensor.numpy().tobytes())``); rows from ``routed_experts_start_len`` (``start``) on.
"""

from __future__ import annotations

import base64
import math
import uuid
from dataclasses import replace

import torch

from ringzero.rollout.server.schema import TextOptions
from ringzero.rollout.types import Completion, LogprobRequest


class EngineCrash(Exception):
    """The engine failed on input it did not refuse, or answered out of contract: an HTTP 500."""


def finish_reason(c: Completion) -> dict:
    if c.finish_reason == "length":
        return {"type": "length", "length": len(c.output_ids)}
    if c.finish_reason == "stop":
        return {"type": "stop", "matched": c.matched_stop}
    return {
        "type": "abort",
        "message": str(c.meta.get("message", "aborted by the engine")),
        "status_code": None,
        "err_type": None,
    }


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


def json_float(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


class TokenText:
    """Each token's own text (specials included), decoded once per answer."""

    def __init__(self, tokenizer):
        self.tokenizer, self._cache = tokenizer, {}

    def __call__(self, token_id: int) -> str:
        if token_id not in self._cache:
            self._cache[token_id] = self.tokenizer.decode([token_id], skip_special=False)
        return self._cache[token_id]


def checked_logprobs(c: Completion, wanted: LogprobRequest) -> Completion:
    """``c`` with the log-probs its request asked for, lined up with the tokens they describe.

    A prompt range holding at most the prompt's last position needs no values (its one entry is None),
    so it is filled in here for an engine that computes none; anything else asked for and missing is
    the engine answering out of contract.
    """
    n, size = len(c.output_ids), len(c.prompt_ids)
    if len(c.output_logprobs) != n:
        raise EngineCrash(f"engine returned {len(c.output_logprobs)} log-probs for {n} output tokens")
    output_top, prompt, prompt_top = c.output_top_logprobs, c.prompt_logprobs, c.prompt_top_logprobs
    if wanted.top_k and output_top is None and n:
        raise EngineCrash("engine returned no top-k log-probs for a request that asked for them")
    if output_top is not None and len(output_top) != n:
        raise EngineCrash(f"engine returned {len(output_top)} top-k entries for {n} output tokens")
    start = wanted.prompt_from
    if start is not None and prompt is None:
        if start >= size - 1:
            prompt = [None] * (size - start)
        elif not (c.finish_reason == "abort" and not n):  # aborted before its prefill: nothing was scored
            raise EngineCrash("engine returned no prompt log-probs for a request that asked for them")
    if prompt is not None:
        if start is None or len(prompt) != size - start:
            raise EngineCrash(
                f"engine returned {len(prompt)} prompt log-probs for positions {start}..{size - 1}"
            )
        if wanted.top_k and prompt_top is None:
            if len(prompt) > 1:
                raise EngineCrash(
                    "engine returned no prompt top-k log-probs for a request that asked for them"
                )
            prompt_top = [None] * len(prompt)
    return replace(
        c,
        output_top_logprobs=output_top or ([] if wanted.top_k else None),
        prompt_logprobs=prompt,
        prompt_top_logprobs=prompt_top if wanted.top_k and prompt is not None else None,
    )


def prompt_range(c: Completion) -> list[int]:
    """The prompt tokens ``prompt_logprobs`` describes: the last ``len(prompt_logprobs)`` of the prompt."""
    return c.prompt_ids[len(c.prompt_ids) - len(c.prompt_logprobs or []) :]


def _triples(logprobs, ids, text: TokenText | None) -> list[list]:
    return [
        [json_float(lp), int(t), text(int(t)) if text else None] for lp, t in zip(logprobs, ids, strict=True)
    ]


def _top_triples(tops, text: TokenText | None) -> list[list[list] | None]:
    return [
        None if top is None else _triples([lp for lp, _ in top], [t for _, t in top], text) for top in tops
    ]


def logprob_meta(c: Completion, tokenizer, wanted: LogprobRequest, *, with_text: bool) -> dict:
    """The ``meta_info`` log-prob fields of one completion (``return_logprob``)."""
    c = checked_logprobs(c, wanted)
    text = TokenText(tokenizer) if with_text else None
    meta = {"output_token_logprobs": _triples(c.output_logprobs, c.output_ids, text)}
    if c.prompt_logprobs is not None:
        meta["input_token_logprobs"] = _triples(c.prompt_logprobs, prompt_range(c), text)
    if wanted.top_k > 0:
        meta["output_top_logprobs"] = _top_triples(c.output_top_logprobs, text)
        if c.prompt_top_logprobs is not None:
            meta["input_top_logprobs"] = _top_triples(c.prompt_top_logprobs, text)
    return meta


def routed_experts_b64(c: Completion, start: int = 0) -> str | None:
    """``meta_info.routed_experts`` of a completion whose request asked; None when nothing was fed (a
    request aborted before its prefill), as SGLang then answers without the field."""
    fed = len(c.prompt_ids) + len(c.output_ids) - 1
    if c.routed_experts is None:
        if c.finish_reason == "abort" and not c.output_ids:
            return None
        raise EngineCrash("engine returned no routed experts for a request that asked for them")
    experts = torch.as_tensor(c.routed_experts)
    if experts.dim() != 3 or experts.shape[0] != fed or experts.is_floating_point():
        raise EngineCrash(
            f"engine returned routed experts of shape {list(experts.shape)} ({experts.dtype}) for "
            f"{fed} fed tokens; expected integer [{fed}, layers, top-k]"
        )
    rows = experts[min(start, fed) :].to(device="cpu", dtype=torch.int32).contiguous().numpy()
    return base64.b64encode(rows.astype("<i4", copy=False).tobytes()).decode("ascii")


def generate_item(
    c: Completion,
    rid: str,
    tokenizer,
    opts: TextOptions,
    wanted: LogprobRequest,
    *,
    return_logprob: bool,
    text_in_logprobs: bool,
    e2e_latency: float,
    routed_from: int | None = None,
) -> dict:
    """``routed_from``: with ``return_routed_experts``, the first row of ``routed_experts`` to answer."""
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
        meta.update(logprob_meta(c, tokenizer, wanted, with_text=text_in_logprobs))
    if routed_from is not None and (routed := routed_experts_b64(c, routed_from)) is not None:
        meta["routed_experts"] = routed
    return {
        "text": completion_text(c, tokenizer, opts),
        "output_ids": [int(t) for t in c.output_ids],
        "meta_info": meta,
    }


def sample_ids(rid: str | None, n: int) -> list[str]:
    """Response ids of a prompt's samples. SGLang gives each of ``n > 1`` samples a fresh id."""
    if n == 1:
        return [rid or uuid.uuid4().hex]
    return [uuid.uuid4().hex for _ in range(n)]
