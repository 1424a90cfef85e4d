"""OpenAI legacy ``/v1/completions``: the body (SGLang's extra fields included) and the answer.

Bodies map onto the same ``GenerateRequest`` records as ``/generate``, as SGLang's OpenAI layer does:
``logprobs`` k asks for the sampled tokens' log-probs plus a top-k dict per position, ``echo`` puts the
prompt before each choice's text and, with ``logprobs``, the prompt's log-probs before the output's
(the first null, as OpenAI and SGLang report it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from ringzero.rollout.server.format import (
    TokenText,
    checked_logprobs,
    completion_text,
    finish_reason,
    json_float,
    prompt_range,
)
from ringzero.rollout.server.schema import (
    BadRequest,
    ServerLimits,
    TextOptions,
    bool_field,
    check_limits,
    int_field,
    neutral_only,
    parse_sampling,
    prompt_ids,
    show,
    top_k_within,
)
from ringzero.rollout.types import Completion, GenerateRequest, LogprobRequest


@dataclass
class CompletionPlan:
    model: str
    requests: list[GenerateRequest]
    text_options: TextOptions
    logprobs: int | None  # OpenAI's ``logprobs``: None = none, k = the sampled token's plus a top-k dict
    return_token_ids: bool
    echo: list[str] | None  # with ``echo``, each prompt's text, put before its choices' text


# OpenAI names that differ from SGLang's sampling_params names.
_OPENAI_ALIASES = {"max_tokens": "max_new_tokens", "seed": "sampling_seed", "min_tokens": "min_new_tokens"}
_OPENAI_SAMPLING = {
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "n",
    "seed",
    "no_stop_trim",
    "skip_special_tokens",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "logit_bias",
    "json_schema",
    "regex",
    "ebnf",
    "stop_regex",
    "custom_params",
}
_OPENAI_IGNORED = {"model", "user", "rid", "priority", "extra_key"}
_OPENAI_NEUTRAL = {
    "stream": neutral_only(False),
    "suffix": neutral_only(None),
    "stream_options": neutral_only(None),
    "lora_path": neutral_only(None),
    "response_format": neutral_only(None),
    "return_hidden_states": neutral_only(False),
}
_OPENAI_OWN = {"prompt", "logprobs", "return_token_ids", "best_of", "echo"}


def _best_of(value: Any, n: int) -> None:
    if value is not None and value != n:
        raise BadRequest("best_of", f"is not supported; leave it unset or equal to n ({n})")


def parse_completion(
    body: Any,
    tokenizer,
    vocab_size: int,
    limits: ServerLimits | None = None,
    context_length: int | None = None,
) -> CompletionPlan:
    """An OpenAI legacy completions body (SGLang's extra fields included) -> one request per prompt."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    sampling = {"max_tokens": 16}  # OpenAI's default, unlike SGLang's 128
    for name, value in body.items():
        if name in _OPENAI_SAMPLING:
            sampling[name] = value
        elif name in _OPENAI_NEUTRAL:
            _OPENAI_NEUTRAL[name](value, name)
        elif name not in _OPENAI_IGNORED and name not in _OPENAI_OWN:
            raise BadRequest(name, "unknown field for /v1/completions")
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest("model", f"must be a string (got {show(model)})")
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise BadRequest(
            "prompt", f"must be a non-empty string, list of strings or token ids (got {show(prompt)})"
        )
    as_text = isinstance(prompt, str) or isinstance(prompt[0], str)
    key = "text" if as_text else "input_ids"
    try:
        prompts, _ = prompt_ids({key: prompt}, tokenizer, vocab_size)
    except BadRequest as exc:
        raise BadRequest(exc.field.replace(key, "prompt", 1), str(exc).split(": ", 1)[1]) from None
    params, text_options = parse_sampling(sampling, "", _OPENAI_ALIASES)
    _best_of(body.get("best_of"), params.n)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        top_k_within(int_field(logprobs, "logprobs", lo=0), vocab_size, "logprobs")
    echo = body.get("echo")
    echo = False if echo is None else bool_field(echo, "echo")
    # SGLang asks for top_logprobs_num = logprobs, and with echo for the prompt's log-probs from position 0.
    wanted = LogprobRequest(0 if echo else None, logprobs) if logprobs is not None else LogprobRequest()
    return_ids = body.get("return_token_ids")
    requests = [GenerateRequest(list(p), params, logprobs=wanted) for p in prompts]
    check_limits(
        requests,
        limits or ServerLimits(),
        prompt_field="prompt",
        n_field="n",
        max_new_field=lambda i: "max_tokens",
        context_length=context_length,
    )
    texts = (
        [prompt] if isinstance(prompt, str) else prompt if as_text else [tokenizer.decode(p) for p in prompts]
    )
    return CompletionPlan(
        model=model,
        requests=requests,
        text_options=text_options,
        logprobs=logprobs,
        return_token_ids=False if return_ids is None else bool_field(return_ids, "return_token_ids"),
        echo=texts if echo else None,
    )


def _openai_logprobs(c: Completion, tokenizer, wanted: LogprobRequest, echo: bool) -> dict:
    c = checked_logprobs(c, wanted)
    text = TokenText(tokenizer)
    n = len(c.output_ids)
    entries = list(zip(c.output_logprobs, c.output_ids, c.output_top_logprobs or [None] * n, strict=True))
    if echo and c.prompt_logprobs is not None:
        ids = prompt_range(c)
        tops = c.prompt_top_logprobs or [None] * len(ids)
        entries = list(zip(c.prompt_logprobs, ids, tops, strict=True)) + entries
    # text_offset: where each token starts in the choice's text (SGLang sends -1 here).
    tokens, offsets, at = [], [], 0
    for _, tid, _ in entries:
        piece = text(int(tid))
        tokens.append(piece)
        offsets.append(at)
        at += len(piece)
    top_logprobs = (
        [None if top is None else {text(int(t)): json_float(lp) for lp, t in top} for _, _, top in entries]
        if wanted.top_k > 0
        else []
    )
    return {
        "tokens": tokens,
        "token_logprobs": [json_float(lp) for lp, _, _ in entries],
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def openai_completion(groups: list[list[Completion]], tokenizer, plan: CompletionPlan) -> dict:
    """Choices in prompt-major order (prompt i's samples at ``i * n + j``), as SGLang numbers them."""
    choices = []
    for i, group in enumerate(groups):
        for c in group:
            reason = finish_reason(c)
            choice = {
                "index": len(choices),
                "text": (plan.echo[i] if plan.echo else "")
                + completion_text(c, tokenizer, plan.text_options),
                "logprobs": (
                    None
                    if plan.logprobs is None
                    else _openai_logprobs(c, tokenizer, plan.requests[i].logprobs, plan.echo is not None)
                ),
                "finish_reason": reason["type"],
                "matched_stop": reason.get("matched"),
            }
            if plan.return_token_ids:
                choice["token_ids"] = [int(t) for t in c.output_ids]
            choices.append(choice)
    flat = [c for group in groups for c in group]
    prompt_tokens = sum(len(group[0].prompt_ids) for group in groups if group)
    completion_tokens = sum(len(c.output_ids) for c in flat)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": plan.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "metadata": {"weight_version": str(flat[0].weight_version) if flat else None},
    }
