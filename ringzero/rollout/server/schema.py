"""Request bodies of the rollout server, checked field by field into ``GenerateRequest`` records.

Names and shapes follow SGLang's native ``/generate`` (``GenerateReqInput`` with a ``sampling_params``
dict); ``/v1/completions`` bodies are read in ``ringzero.rollout.server.openai`` and the control
endpoints' in ``ringzero.rollout.server.control``, with the checks defined here. Every refusal is a
``BadRequest`` naming the field,
e.g. ``sampling_params[1].top_p: must be in (0, 1] (got 0)``. SGLang fields this server cannot honour
are accepted only at their neutral value, so a client written for SGLang that sends defaults still works,
while one that relies on a feature we lack hears so instead of getting silently different samples.
"""

from __future__ import annotations

import math
import re
import reprlib
from dataclasses import dataclass, fields
from typing import Any

from ringzero.errors import RingzeroError
from ringzero.rollout.types import GenerateRequest, LogprobRequest, SamplingParams


class BadRequest(RingzeroError):
    """A request body the server refuses; ``field`` is the dotted path of the field at fault."""

    status = 400

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


class BodyTooLarge(BadRequest):
    """A body over ``ServerLimits.max_body_bytes``: HTTP 413, refused before it is read in full."""

    status = 413


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = 6
_REPR.maxlevel = 3


def show(value: Any) -> str:
    """A bounded ``repr`` for error messages: a 60 MB string or a deeply nested list is quoted in brief."""
    return _REPR.repr(value)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of the server (``ringzero serve --max-body-bytes`` and kin).

    ``max_body_bytes``: a body over it is refused with HTTP 413 from its Content-Length, or while a
    chunked body is read, before any of it is parsed. The others refuse a request with HTTP 400 naming
    the field: ``max_request_sequences`` caps the sequences one request decodes (prompts x ``n``),
    ``max_request_tokens`` its prompt tokens plus ``max_new_tokens`` over all those sequences, and
    ``max_new_tokens`` the ``max_new_tokens`` (OpenAI: ``max_tokens``) of any prompt, its default included.
    """

    max_body_bytes: int = 64 * 1024 * 1024
    max_request_sequences: int = 4096
    max_request_tokens: int = 1 << 24
    max_new_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RingzeroError(f"server limit {f.name}: must be an integer >= 1 (got {show(value)})")


MAX_JSON_DEPTH = 32
"""Bodies nest a few levels (a batch of token id lists, per-prompt sampling params); deeper is refused."""


def check_depth(body: Any) -> None:
    """Refuse a body nested deeper than ``MAX_JSON_DEPTH`` (iteratively: no recursion on client data)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            raise BadRequest("body", f"nests deeper than {MAX_JSON_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(text: str) -> int | None:
    """Position of the first lone surrogate (a UTF-16 half, which no UTF-8 text can hold), else None."""
    found = _SURROGATE.search(text)
    return found.start() if found else None


def check_unicode(body: Any) -> None:
    """Refuse a body whose strings are not Unicode text: JSON's ``\\ud800`` escapes decode to lone surrogates,
    which no tokenizer can encode and no answer that quotes them (a ``rid``, a field name) can be sent as
    UTF-8. The refusal names the field and the position (iteratively: no recursion on client data)."""
    stack: list[tuple[Any, str]] = [(body, "body")]
    while stack:
        value, field = stack.pop()
        if isinstance(value, str):
            at = _lone_surrogate(value)
            if at is not None:
                raise BadRequest(
                    field, f"{value[at]!r} at position {at} is a lone surrogate, not Unicode text"
                )
        elif isinstance(value, dict):
            for key, child in value.items():
                name = key if field == "body" else f"{field}.{key}"
                if _lone_surrogate(key) is not None:
                    raise BadRequest(field, f"field name {key!r} holds a lone surrogate, not Unicode text")
                stack.append((child, name))
        elif isinstance(value, list):
            stack.extend((child, f"{field}[{i}]") for i, child in enumerate(value))


def check_limits(
    requests: list[GenerateRequest],
    limits: ServerLimits,
    *,
    prompt_field: str,
    n_field: str,
    max_new_field,
    context_length: int | None = None,
) -> None:
    """Refuse a parsed request over ``limits``; ``max_new_field(i)`` names prompt ``i``'s max_new_tokens.

    With ``context_length`` (the engine's), a prompt that leaves no room to continue is refused by name
    too (one only scored, ``max_new_tokens`` 0, may fill the context)."""
    if context_length is not None:
        for i, req in enumerate(requests):
            if len(req.input_ids) + (req.params.max_new_tokens > 0) > context_length:
                field = f"{prompt_field}[{i}]" if len(requests) > 1 else prompt_field
                raise BadRequest(
                    field,
                    f"has {len(req.input_ids)} tokens, which leave no room to continue under "
                    f"the model's context (max_position_embeddings {context_length})",
                )
    for i, req in enumerate(requests):
        if req.params.max_new_tokens > limits.max_new_tokens:
            raise BadRequest(
                max_new_field(i),
                f"is {req.params.max_new_tokens}, over this server's limit of "
                f"{limits.max_new_tokens} (max_new_tokens)",
            )
    sequences = sum(req.params.n for req in requests)
    if sequences > limits.max_request_sequences:
        field = prompt_field if len(requests) > limits.max_request_sequences else n_field
        raise BadRequest(
            field,
            f"{len(requests)} prompt(s) x n={requests[0].params.n} is {sequences} sequences, "
            f"over this server's limit of {limits.max_request_sequences} per request "
            "(max_request_sequences)",
        )
    tokens = sum(req.params.n * (len(req.input_ids) + req.params.max_new_tokens) for req in requests)
    if tokens > limits.max_request_tokens:
        raise BadRequest(
            prompt_field,
            f"asks for {tokens} tokens (prompt tokens plus max_new_tokens over its "
            f"{sequences} sequences), over this server's limit of "
            f"{limits.max_request_tokens} per request (max_request_tokens)",
        )


# --- scalar checks ---------------------------------------------------------------------------------


INT64_MAX = 2**63 - 1


def int_field(value: Any, field: str, *, lo: int | None = None, hi: int | None = INT64_MAX) -> int:
    """An integer in ``lo..hi``; by default at most int64's largest, so it fits an engine's id tensors."""
    # bool is an int subclass in Python; JSON true must not pass for a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(field, f"must be an integer (got {show(value)})")
    if lo is not None and value < lo:
        raise BadRequest(field, f"must be >= {lo} (got {show(value)})")
    if hi is not None and value > hi:
        raise BadRequest(field, f"must be <= {hi} (got {show(value)})")
    return value


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(field, f"must be a finite number (got {show(value)})")
    return float(value)


def bool_field(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(field, f"must be true or false (got {show(value)})")
    return value


def _str_list(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return tuple(value)
    raise BadRequest(field, f"must be a non-empty string or a list of non-empty strings (got {show(value)})")


def _id_list(value: Any, field: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest(field, f"must be a list of token ids (got {show(value)})")
    return tuple(int_field(t, f"{field}[{i}]", lo=0) for i, t in enumerate(value))


def neutral_only(expected: Any):
    """A field we accept only at the value under which it changes nothing (or a per-prompt list of it)."""

    def check(value: Any, field: str) -> None:
        values = value if isinstance(value, list) and expected is None else [value]
        if all(v is None or v == expected for v in values):
            return None
        raise BadRequest(field, f"is not supported by this server; only {expected!r} (no effect) is accepted")

    return check


def _no_media(value: Any, field: str) -> None:
    """``image_data`` and kin on a text model: null, or lists (per prompt, per item) holding only nulls."""
    if value is None or (isinstance(value, list) and all(_no_media(v, field) is None for v in value)):
        return None
    raise BadRequest(field, "this server serves a text-only model; only null entries (no media) are accepted")


def object_or_null(value: Any, field: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise BadRequest(field, f"must be an object or null (got {show(value)})")


# --- sampling parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TextOptions:
    """Per-prompt settings that shape only the returned text, never the sampled tokens."""

    no_stop_trim: bool = False
    skip_special_tokens: bool = True


# SGLang's sampling_params names. Each entry: checker(value, field) -> value for SamplingParams (or
# TextOptions), or None when the field is accepted without effect.
_SAMPLING: dict[str, Any] = {
    "max_new_tokens": lambda v, f: int_field(v, f, lo=0),  # 0: score the prompt only
    "temperature": lambda v, f: _temperature(_float(v, f), f),
    "top_p": lambda v, f: _top_p(_float(v, f), f),
    "top_k": lambda v, f: int_field(v, f, lo=-1),
    "stop": _str_list,
    "stop_token_ids": _id_list,
    "n": lambda v, f: int_field(v, f, lo=1),
    "sampling_seed": lambda v, f: int_field(v, f, hi=None),  # any integer: the engine mixes it modulo 2**63
    "no_stop_trim": bool_field,
    "skip_special_tokens": bool_field,
    "ignore_eos": bool_field,
    # No-ops here at any value: nothing streams, and our decoders put no spaces between specials.
    "stream_interval": lambda v, f: None,
    "spaces_between_special_tokens": lambda v, f: None,
    "min_p": neutral_only(0.0),
    "frequency_penalty": neutral_only(0.0),
    "presence_penalty": neutral_only(0.0),
    "repetition_penalty": neutral_only(1.0),
    "min_new_tokens": neutral_only(0),
    "logit_bias": lambda v, f: None if not v else neutral_only(None)(v, f),
    "json_schema": neutral_only(None),
    "regex": neutral_only(None),
    "ebnf": neutral_only(None),
    "structural_tag": neutral_only(None),
    "stop_regex": neutral_only(None),
    # Read only by a custom logit processor, which this server refuses; slime sends it whenever top_p < 1.
    "custom_params": object_or_null,
}
_TO_PARAMS = {
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "n": "n",
    "sampling_seed": "seed",
    "ignore_eos": "ignore_eos",
}
_TO_TEXT = {"no_stop_trim", "skip_special_tokens"}


def _top_p(value: float, field: str) -> float:
    if not 0 < value <= 1:
        raise BadRequest(field, f"must be in (0, 1] (got {value})")
    return value


SAMPLING_EPS = 1e-6
"""SGLang's ``_SAMPLING_EPS``: a temperature below it samples greedily (1 / 1e-300 would overflow the
logits)."""


def _temperature(value: float, field: str) -> float:
    if value < 0:
        raise BadRequest(field, f"must be >= 0 (got {value})")
    return 0.0 if value < SAMPLING_EPS else value


def parse_sampling(
    fields: dict,
    where: str,
    aliases: dict[str, str] | None = None,
) -> tuple[SamplingParams, TextOptions]:
    """SGLang ``sampling_params`` (or OpenAI fields renamed through ``aliases``) -> our records.

    ``aliases`` maps a body name to the SGLang name, so errors name what the client sent.
    """
    aliases = aliases or {}
    params: dict[str, Any] = {}
    text: dict[str, bool] = {}
    for name, value in fields.items():
        sglang_name = aliases.get(name, name)
        label = f"{where}.{name}" if where else name
        check = _SAMPLING.get(sglang_name)
        if check is None:
            raise BadRequest(label, "unknown field")
        if value is None:
            continue  # SGLang reads null as "use the default"
        checked = check(value, label)
        if sglang_name in _TO_PARAMS:
            params[_TO_PARAMS[sglang_name]] = checked
        elif sglang_name in _TO_TEXT:
            text[sglang_name] = checked
    try:
        return SamplingParams(**params), TextOptions(**text)
    except RingzeroError as exc:
        # SamplingParams names each bad field itself ("sampling_params: top_p must be in (0, 1] ...").
        raise BadRequest(where or "sampling_params", str(exc).removeprefix("sampling_params: ")) from None


# --- /generate -------------------------------------------------------------------------------------


@dataclass
class GeneratePlan:
    """One ``/generate`` body: a request per prompt (``n`` samples each) and how to answer it.

    With ``return_logprob`` a request carries its prompt range and top-k in ``GenerateRequest.logprobs``;
    with ``return_routed_experts`` its flag is set, and ``routed_from`` holds the first row to answer.
    """

    requests: list[GenerateRequest]
    text_options: list[TextOptions]
    return_logprob: list[bool]
    text_in_logprobs: bool
    single: bool  # a single prompt with n == 1 answers with one object, anything else with a list
    routed_from: list[int]  # per prompt, SGLang's routed_experts_start_len (0: from the first token)

    @property
    def n(self) -> int:
        return self.requests[0].params.n


# Fields that change nothing in a non-streaming answer (metrics, logging, tracing and routing hints;
# cache_salt only keys a prefix cache, which this server has none of).
_GENERATE_IGNORED = {
    "log_metrics",
    "priority",
    "custom_labels",
    "no_logs",
    "extra_key",
    "routing_key",
    "session_id",
    "conversation_id",
    "external_trace_header",
    "received_time",
    "kv_router_hint",
    "cache_salt",
}
# Fields a router or a client sends at their defaults; anything else is refused (one data-parallel rank,
# no prefill/decode disaggregation, no adapters, no media, nothing streamed).
_GENERATE_NEUTRAL = {
    "stream": neutral_only(False),
    "input_embeds": neutral_only(None),
    "image_data": _no_media,
    "video_data": _no_media,
    "audio_data": _no_media,
    "modalities": neutral_only(None),
    "mm_hashes": neutral_only(None),
    "mm_content_hashes": neutral_only(None),
    "lora_path": neutral_only(None),
    "lora_id": neutral_only(None),
    "session_params": neutral_only(None),
    "token_ids_logprob": neutral_only(None),
    "return_hidden_states": neutral_only(False),
    "return_entropy": neutral_only(False),
    "return_prompt_token_ids": neutral_only(False),
    "return_sampling_mask": neutral_only(False),
    "return_flat_raw_top_logprobs": neutral_only(False),
    "return_flat_raw_top_logprobs_b64": neutral_only(False),
    "custom_logit_processor": neutral_only(None),
    "positional_embed_overrides": neutral_only(None),
    "data_parallel_rank": neutral_only(0),
    "routed_dp_rank": neutral_only(0),
    "disagg_prefill_dp_rank": neutral_only(None),
    "bootstrap_host": neutral_only(None),
    "bootstrap_port": neutral_only(None),
    "bootstrap_room": neutral_only(None),
    "bootstrap_pair_key": neutral_only(None),
    "decode_tp_size": neutral_only(None),
    "background": neutral_only(False),
    "require_reasoning": neutral_only(False),
    "max_thinking_tokens": neutral_only(None),
}
_GENERATE_FIELDS = {
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "temp_scaled_logprobs",
    "rid",
    "return_routed_experts",
    "routed_experts_start_len",
}


def _per_prompt(value: Any, field: str, size: int, check, default):
    """SGLang lets a per-prompt field be one value for all prompts or a list with one per prompt."""
    if value is None:
        return [default] * size
    if isinstance(value, list):
        if len(value) != size:
            raise BadRequest(field, f"has {len(value)} entries for {size} prompts")
        return [default if v is None else check(v, f"{field}[{i}]") for i, v in enumerate(value)]
    return [check(value, field)] * size


def prompt_ids(body: dict, tokenizer, vocab_size: int) -> tuple[list[list[int]], bool]:
    """The prompts as token ids, and whether the body held a single prompt."""
    has_text, has_ids = body.get("text") is not None, body.get("input_ids") is not None
    if has_text == has_ids:
        raise BadRequest("text", "give exactly one of text or input_ids")
    if has_text:
        text = body["text"]
        single = isinstance(text, str)
        texts = [text] if single else text
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise BadRequest("text", "must be a string or a non-empty list of strings")
        prompts = []
        for i, t in enumerate(texts):
            try:
                prompts.append(tokenizer.encode(t))
            except RingzeroError as exc:
                raise BadRequest("text" if single else f"text[{i}]", str(exc)) from None
        label = ["text"] if single else [f"text[{i}]" for i in range(len(texts))]
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise BadRequest("input_ids", "must be a non-empty list of token ids or of such lists")
        single = not isinstance(ids[0], list)
        rows = [ids] if single else ids
        label = ["input_ids"] if single else [f"input_ids[{i}]" for i in range(len(rows))]
        prompts = []
        for row, field in zip(rows, label, strict=True):
            if not isinstance(row, list):
                raise BadRequest(field, f"must be a list of token ids (got {show(row)})")
            prompts.append([int_field(t, f"{field}[{j}]", lo=0) for j, t in enumerate(row)])
    for prompt, field in zip(prompts, label, strict=True):
        if not prompt:
            raise BadRequest(field, "is empty; a prompt needs at least one token")
        bad = [t for t in prompt if t >= vocab_size]
        if bad:
            raise BadRequest(field, f"token ids {bad[:5]} are outside the vocabulary of {vocab_size}")
    return prompts, single


def _rids(value: Any, size: int) -> list[str | None]:
    # SGLang: a string is the rid of a single prompt, or the prefix "<rid>_<i>" of a batch.
    if value is None:
        return [None] * size
    if isinstance(value, str):
        return [value] if size == 1 else [f"{value}_{i}" for i in range(size)]
    if isinstance(value, list) and len(value) == size and all(isinstance(r, str) for r in value):
        if len(set(value)) != size:
            raise BadRequest("rid", "repeats an id within the request")
        return list(value)
    raise BadRequest("rid", f"must be a string or a list of {size} distinct strings (got {show(value)})")


def parse_generate(
    body: Any,
    tokenizer,
    vocab_size: int,
    routing_shape: tuple[int, int] | None = None,
    limits: ServerLimits | None = None,
    context_length: int | None = None,
) -> GeneratePlan:
    """``routing_shape``: the served model's ``(num_hidden_layers, num_experts_per_tok)``; None (a dense
    model) refuses ``return_routed_experts``. ``limits``: by default ``ServerLimits()``; ``context_length``:
    the engine's, when it has one (see ``check_limits``)."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for name, value in body.items():
        if name in _GENERATE_FIELDS or name in _GENERATE_IGNORED:
            continue
        if name not in _GENERATE_NEUTRAL:
            raise BadRequest(name, "unknown field for /generate")
        _GENERATE_NEUTRAL[name](value, name)
    prompts, single = prompt_ids(body, tokenizer, vocab_size)
    size = len(prompts)

    raw = body.get("sampling_params")
    if raw is None or isinstance(raw, dict):
        raw_list = [raw or {}] * size
        labels = ["sampling_params"] * size
    elif isinstance(raw, list) and len(raw) == size and all(isinstance(p, dict) for p in raw):
        raw_list, labels = raw, [f"sampling_params[{i}]" for i in range(size)]
    else:
        raise BadRequest("sampling_params", f"must be an object or a list of {size} objects, one per prompt")
    parsed = [parse_sampling(p, label) for p, label in zip(raw_list, labels, strict=True)]
    if len({params.n for params, _ in parsed}) > 1:
        # SGLang expands n per request and refuses a batch whose entries disagree on it.
        raise BadRequest("sampling_params", "n must be the same for every prompt of a batch")

    return_logprob = _per_prompt(body.get("return_logprob"), "return_logprob", size, bool_field, False)
    starts = _per_prompt(
        body.get("logprob_start_len"), "logprob_start_len", size, lambda v, f: int_field(v, f, lo=-1), -1
    )
    tops = _per_prompt(
        body.get("top_logprobs_num"), "top_logprobs_num", size, lambda v, f: int_field(v, f, lo=0), 0
    )
    scaled = body.get("temp_scaled_logprobs")
    scaled = False if scaled is None else bool_field(scaled, "temp_scaled_logprobs")
    text_in_logprobs = body.get("return_text_in_logprobs")
    rids = _rids(body.get("rid"), size)
    routed = _per_prompt(body.get("return_routed_experts"), "return_routed_experts", size, bool_field, False)
    if any(routed) and routing_shape is None:
        raise BadRequest(
            "return_routed_experts",
            "the served model has no MoE layers, so no routed experts to return; only false is accepted",
        )
    routed_from = _routed_from(body.get("routed_experts_start_len"), prompts)
    requests = []
    for i, (prompt, (params, _), rid) in enumerate(zip(prompts, parsed, rids, strict=True)):
        logprobs = LogprobRequest()
        if return_logprob[i]:
            start_field, top_field = (
                f"{name}[{i}]" if isinstance(body.get(name), list) else name
                for name in ("logprob_start_len", "top_logprobs_num")
            )
            logprobs = LogprobRequest(
                _prompt_from(starts[i], len(prompt), params.max_new_tokens, start_field),
                top_k_within(tops[i], vocab_size, top_field),
                scaled,
            )
        requests.append(GenerateRequest(list(prompt), params, rid, logprobs, return_routed_experts=routed[i]))
    per_prompt = labels[0] != "sampling_params"
    check_limits(
        requests,
        limits or ServerLimits(),
        prompt_field="text" if body.get("text") is not None else "input_ids",
        n_field=f"{labels[0]}.n",
        max_new_field=lambda i: f"{labels[i] if per_prompt else 'sampling_params'}.max_new_tokens",
        context_length=context_length,
    )
    return GeneratePlan(
        requests=requests,
        text_options=[opts for _, opts in parsed],
        return_logprob=return_logprob,
        text_in_logprobs=False
        if text_in_logprobs is None
        else bool_field(text_in_logprobs, "return_text_in_logprobs"),
        single=single and parsed[0][0].n == 1,
        routed_from=routed_from,
    )


def _routed_from(value: Any, prompts: list[list[int]]) -> list[int]:
    """SGLang's ``routed_experts_start_len``: the answer covers rows ``[start, seqlen - 1)``, start in
    ``0..len(prompt)`` (``GenerateReqInput`` in ``python/sglang/srt/managers/io_struct.py``)."""
    starts = _per_prompt(
        value, "routed_experts_start_len", len(prompts), lambda v, f: int_field(v, f, lo=0), 0
    )
    for i, (start, prompt) in enumerate(zip(starts, prompts, strict=True)):
        if start > len(prompt):
            field = (
                f"routed_experts_start_len[{i}]" if isinstance(value, list) else "routed_experts_start_len"
            )
            raise BadRequest(field, f"is {start}, past the prompt's {len(prompt)} tokens")
    return starts


def _prompt_from(start: int, prompt_len: int, max_new_tokens: int, field: str) -> int:
    """SGLang's prompt range: -1 is the last prompt position (none at all when only scoring the prompt)."""
    if start == -1:
        return prompt_len if max_new_tokens == 0 else prompt_len - 1
    limit = prompt_len if max_new_tokens == 0 else prompt_len - 1
    if start > limit:
        raise BadRequest(field, f"is {start}, past the prompt's last position {limit} ({prompt_len} tokens)")
    return start


def top_k_within(k: int, vocab_size: int, field: str) -> int:
    if k > vocab_size:
        raise BadRequest(field, f"is {k}, more than the {vocab_size} tokens of the vocabulary")
    return k
