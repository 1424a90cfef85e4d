"""Request bodies of the rollout server, checked field by field into ``GenerateRequest`` records.

Names and shapes follow SGLang's native ``/generate`` (``GenerateReqInput`` with a ``sampling_params``
dict) and its OpenAI-compatible ``/v1/completions``. Every refusal is a ``BadRequest`` naming the field,
e.g. ``sampling_params[1].top_p: must be in (0, 1] (got 0)``. SGLang fields this server cannot honour
are accepted only at their neutral value, so a client written for SGLang that sends defaults still works,
while one that relies on a feature we lack hears so instead of getting silently different samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ringzero.errors import RingzeroError
from ringzero.rollout.types import GenerateRequest, SamplingParams


class BadRequest(RingzeroError):
    """A request body the server refuses; ``field`` is the dotted path of the field at fault."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


# --- scalar checks ---------------------------------------------------------------------------------


def _int(value: Any, field: str, *, lo: int | None = None) -> int:
    # bool is an int subclass in Python; JSON true must not pass for a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(field, f"must be an integer (got {value!r})")
    if lo is not None and value < lo:
        raise BadRequest(field, f"must be >= {lo} (got {value})")
    return value


def _float(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(field, f"must be a finite number (got {value!r})")
    return float(value)


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(field, f"must be true or false (got {value!r})")
    return value


def _str_list(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return tuple(value)
    raise BadRequest(field, f"must be a non-empty string or a list of non-empty strings (got {value!r})")


def _id_list(value: Any, field: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest(field, f"must be a list of token ids (got {value!r})")
    return tuple(_int(t, f"{field}[{i}]", lo=0) for i, t in enumerate(value))


def _neutral(expected: Any):
    """A field we accept only at the value under which it changes nothing."""

    def check(value: Any, field: str) -> None:
        if value is None or value == expected:
            return None
        raise BadRequest(field, f"is not supported by this server; only {expected!r} (no effect) is accepted")

    return check


# --- sampling parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TextOptions:
    """Per-prompt settings that shape only the returned text, never the sampled tokens."""

    no_stop_trim: bool = False
    skip_special_tokens: bool = True


# SGLang's sampling_params names. Each entry: checker(value, field) -> value for SamplingParams (or
# TextOptions), or None when the field is accepted without effect.
_SAMPLING: dict[str, Any] = {
    "max_new_tokens": lambda v, f: _int(v, f, lo=1),
    "temperature": lambda v, f: _nonneg(_float(v, f), f),
    "top_p": lambda v, f: _top_p(_float(v, f), f),
    "top_k": lambda v, f: _int(v, f, lo=-1),
    "stop": _str_list,
    "stop_token_ids": _id_list,
    "n": lambda v, f: _int(v, f, lo=1),
    "sampling_seed": lambda v, f: _int(v, f),
    "no_stop_trim": _bool,
    "skip_special_tokens": _bool,
    # No-ops here at any value: nothing streams, and our decoders put no spaces between specials.
    "stream_interval": lambda v, f: None,
    "spaces_between_special_tokens": lambda v, f: None,
    "min_p": _neutral(0.0),
    "frequency_penalty": _neutral(0.0),
    "presence_penalty": _neutral(0.0),
    "repetition_penalty": _neutral(1.0),
    "min_new_tokens": _neutral(0),
    "ignore_eos": _neutral(False),
    "logit_bias": lambda v, f: None if not v else _neutral(None)(v, f),
    "json_schema": _neutral(None),
    "regex": _neutral(None),
    "ebnf": _neutral(None),
    "structural_tag": _neutral(None),
    "stop_regex": _neutral(None),
    "custom_params": _neutral(None),
}
_TO_PARAMS = {"max_new_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
              "top_k": "top_k", "stop": "stop", "stop_token_ids": "stop_token_ids", "n": "n",
              "sampling_seed": "seed"}
_TO_TEXT = {"no_stop_trim", "skip_special_tokens"}


def _top_p(value: float, field: str) -> float:
    if not 0 < value <= 1:
        raise BadRequest(field, f"must be in (0, 1] (got {value})")
    return value


def _nonneg(value: float, field: str) -> float:
    if value < 0:
        raise BadRequest(field, f"must be >= 0 (got {value})")
    return value


def parse_sampling(fields: dict, where: str, aliases: dict[str, str] | None = None,
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
    """One ``/generate`` body: a request per prompt (``n`` samples each) and how to answer it."""

    requests: list[GenerateRequest]
    text_options: list[TextOptions]
    return_logprob: list[bool]
    text_in_logprobs: bool
    single: bool  # a single prompt with n == 1 answers with one object, anything else with a list

    @property
    def n(self) -> int:
        return self.requests[0].params.n


# Fields that change nothing in a non-streaming answer (metrics, logging and routing hints).
_GENERATE_IGNORED = {"log_metrics", "priority", "custom_labels", "no_logs", "extra_key", "routing_key"}
_GENERATE_NEUTRAL = {
    "stream": _neutral(False),
    "input_embeds": _neutral(None),
    "image_data": _neutral(None),
    "video_data": _neutral(None),
    "audio_data": _neutral(None),
    "lora_path": _neutral(None),
    "session_params": _neutral(None),
    "token_ids_logprob": _neutral(None),
    "return_hidden_states": _neutral(False),
    "custom_logit_processor": _neutral(None),
}
_GENERATE_FIELDS = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                    "top_logprobs_num", "return_text_in_logprobs", "rid"}


def _per_prompt(value: Any, field: str, size: int, check, default):
    """SGLang lets a per-prompt field be one value for all prompts or a list with one per prompt."""
    if value is None:
        return [default] * size
    if isinstance(value, list):
        if len(value) != size:
            raise BadRequest(field, f"has {len(value)} entries for {size} prompts")
        return [default if v is None else check(v, f"{field}[{i}]") for i, v in enumerate(value)]
    return [check(value, field)] * size


def _prompts(body: dict, tokenizer, vocab_size: int) -> tuple[list[list[int]], bool]:
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
                raise BadRequest(field, f"must be a list of token ids (got {row!r})")
            prompts.append([_int(t, f"{field}[{j}]", lo=0) for j, t in enumerate(row)])
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
    raise BadRequest("rid", f"must be a string or a list of {size} distinct strings (got {value!r})")


def parse_generate(body: Any, tokenizer, vocab_size: int) -> GeneratePlan:
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for name, value in body.items():
        if name in _GENERATE_FIELDS or name in _GENERATE_IGNORED:
            continue
        if name not in _GENERATE_NEUTRAL:
            raise BadRequest(name, "unknown field for /generate")
        _GENERATE_NEUTRAL[name](value, name)
    prompts, single = _prompts(body, tokenizer, vocab_size)
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

    if _per_prompt(body.get("logprob_start_len"), "logprob_start_len", size, _int, -1) != [-1] * size:
        raise BadRequest("logprob_start_len", "prompt log-probs are not supported; only -1 is accepted")
    if _per_prompt(body.get("top_logprobs_num"), "top_logprobs_num", size, _int, 0) != [0] * size:
        raise BadRequest("top_logprobs_num", "top log-probs are not supported; only 0 is accepted")
    text_in_logprobs = body.get("return_text_in_logprobs")
    rids = _rids(body.get("rid"), size)
    requests = [GenerateRequest(list(p), params, rid)
                for p, (params, _), rid in zip(prompts, parsed, rids, strict=True)]
    return GeneratePlan(
        requests=requests,
        text_options=[opts for _, opts in parsed],
        return_logprob=_per_prompt(body.get("return_logprob"), "return_logprob", size, _bool, False),
        text_in_logprobs=False if text_in_logprobs is None else _bool(text_in_logprobs, "return_text_in_logprobs"),
        single=single and parsed[0][0].n == 1,
    )


# --- /v1/completions -------------------------------------------------------------------------------


@dataclass
class CompletionPlan:
    model: str
    requests: list[GenerateRequest]
    text_options: TextOptions
    logprobs: bool
    return_token_ids: bool


# OpenAI names that differ from SGLang's sampling_params names.
_OPENAI_ALIASES = {"max_tokens": "max_new_tokens", "seed": "sampling_seed", "min_tokens": "min_new_tokens"}
_OPENAI_SAMPLING = {"max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "n", "seed",
                    "no_stop_trim", "skip_special_tokens", "min_p", "frequency_penalty", "presence_penalty",
                    "repetition_penalty", "min_tokens", "ignore_eos", "logit_bias", "json_schema", "regex",
                    "ebnf", "stop_regex", "custom_params"}
_OPENAI_IGNORED = {"model", "user", "rid", "priority", "extra_key"}
_OPENAI_NEUTRAL = {
    "stream": _neutral(False),
    "echo": _neutral(False),
    "suffix": _neutral(None),
    "stream_options": _neutral(None),
    "lora_path": _neutral(None),
    "response_format": _neutral(None),
    "return_hidden_states": _neutral(False),
}


def _best_of(value: Any, n: int) -> None:
    if value is not None and value != n:
        raise BadRequest("best_of", f"is not supported; leave it unset or equal to n ({n})")


def parse_completion(body: Any, tokenizer, vocab_size: int) -> CompletionPlan:
    """An OpenAI legacy completions body (SGLang's extra fields included) -> one request per prompt."""
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    sampling = {"max_tokens": 16}  # OpenAI's default, unlike SGLang's 128
    for name, value in body.items():
        if name in _OPENAI_SAMPLING:
            sampling[name] = value
        elif name in _OPENAI_NEUTRAL:
            _OPENAI_NEUTRAL[name](value, name)
        elif name not in _OPENAI_IGNORED and name not in {"prompt", "logprobs", "return_token_ids", "best_of"}:
            raise BadRequest(name, "unknown field for /v1/completions")
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest("model", f"must be a string (got {model!r})")
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)) or not prompt:
        raise BadRequest("prompt", f"must be a non-empty string, list of strings or token ids (got {prompt!r})")
    key = "text" if isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str)) else "input_ids"
    try:
        prompts, _ = _prompts({key: prompt}, tokenizer, vocab_size)
    except BadRequest as exc:
        raise BadRequest(exc.field.replace(key, "prompt", 1), str(exc).split(": ", 1)[1]) from None
    params, text_options = parse_sampling(sampling, "", _OPENAI_ALIASES)
    _best_of(body.get("best_of"), params.n)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        _int(logprobs, "logprobs", lo=0)
    return_ids = body.get("return_token_ids")
    return CompletionPlan(
        model=model,
        requests=[GenerateRequest(list(p), params) for p in prompts],
        text_options=text_options,
        logprobs=logprobs is not None,
        return_token_ids=False if return_ids is None else _bool(return_ids, "return_token_ids"),
    )


# --- /update_weights_from_disk ---------------------------------------------------------------------


@dataclass
class WeightUpdate:
    model_path: str
    weight_version: str | None
    flush_cache: bool


_UPDATE_IGNORED = {"abort_all_requests", "torch_empty_cache", "recapture_cuda_graph", "token_step", "is_async"}


def parse_weight_update(body: Any) -> WeightUpdate:
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    known = {"model_path", "load_format", "weight_version", "flush_cache"}
    for name in body:
        if name not in known and name not in _UPDATE_IGNORED:
            raise BadRequest(name, "unknown field for /update_weights_from_disk")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise BadRequest("model_path", f"must be a non-empty checkpoint URI (got {path!r})")
    load_format = body.get("load_format")
    if load_format not in (None, "auto", "safetensors"):
        raise BadRequest("load_format", f"must be null, 'auto' or 'safetensors' (got {load_format!r})")
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise BadRequest("weight_version", f"must be a string (got {version!r})")
    flush = body.get("flush_cache")
    return WeightUpdate(path, version, True if flush is None else _bool(flush, "flush_cache"))
