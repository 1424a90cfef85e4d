"""The records every rollout engine and client exchange (SGLang's native API maps onto these 1:1)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ringzero.errors import RingzeroError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings, named as SGLang's ``sampling_params``."""

    max_new_tokens: int = 128  # 0 = score the prompt only (prefill, no decoding)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off (SGLang uses -1)
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None  # SGLang: sampling_seed
    ignore_eos: bool = False  # SGLang: EOS and stop_token_ids do not end a row; stop strings still do

    def __post_init__(self) -> None:
        problems = []
        if self.max_new_tokens < 0:
            problems.append(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1] (got {self.top_p})")
        if self.top_k < -1:
            problems.append(f"top_k must be -1, 0 (off) or positive (got {self.top_k})")
        if self.n < 1:
            problems.append(f"n must be >= 1 (got {self.n})")
        if problems:
            raise RingzeroError("sampling_params: " + "; ".join(problems))


@dataclass(frozen=True)
class LogprobRequest:
    """Log-probs a request asks for beyond those of its sampled tokens (SGLang's names in comments).

    ``prompt_from`` (``logprob_start_len``): report prompt positions ``prompt_from..len(prompt)-1``;
    None = none. ``top_k`` (``top_logprobs_num``): the ``top_k`` most likely tokens at each reported
    position. ``prompt_temperature_scaled`` (``temp_scaled_logprobs``): prompt log-probs under the
    request's temperature; by default they are the plain ``log_softmax(logits)``, as SGLang reports them.
    """

    prompt_from: int | None = None
    top_k: int = 0
    prompt_temperature_scaled: bool = False


@dataclass(frozen=True)
class GenerateRequest:
    input_ids: list[int]
    params: SamplingParams = SamplingParams()
    rid: str | None = None
    logprobs: LogprobRequest = LogprobRequest()
    return_routed_experts: bool = False  # SGLang's request flag: report each token's experts (MoE models)


@dataclass
class Completion:
    """One sampled continuation. ``output_logprobs[i]`` is the rollout engine's log-prob of
    ``output_ids[i]``: log-softmax of logits / temperature, before top-p/top-k renormalization
    (SGLang's convention); under greedy decoding (temperature 0) the plain log-softmax."""

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"]  # abort: cut short by the client; outputs so far
    matched_stop: int | str | None = None
    weight_version: str = "0"
    meta: dict = field(default_factory=dict)
    # Only when the request asked (``GenerateRequest.logprobs``); top-k entries are (logprob, token_id)
    # pairs, most likely first. ``prompt_logprobs[j]`` is prompt position ``prompt_from + j``; its first
    # entry is None (SGLang reports none for the first position of the range).
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    # Only with ``return_routed_experts``: int32 ``[len(prompt) + len(output) - 1, num_hidden_layers,
    # num_experts_per_tok]``, the experts each fed token went to in each layer, -1 on dense layers (the
    # layout of SGLang's ``meta_info["routed_experts"]``; the last sampled token is never fed).
    routed_experts: Any = None


class RolloutClient(Protocol):
    """What the RL loop drives: the in-process engine or an SGLang-compatible HTTP server alike."""

    def generate(self, requests: list[GenerateRequest]) -> list[list[Completion]]:
        """``n`` completions per request, in request order."""
        ...

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        """Load a committed checkpoint; later generations report ``weight_version``."""
        ...

    def health(self) -> bool: ...


class ServerClient(RolloutClient, Protocol):
    """One rollout server's client, as a replica set drives it (the HTTP client of SGLang's API is one):
    the replica set spreads requests, checks versions and recovers, and never builds these itself."""

    endpoint: str
    routing_shape: tuple[int, int] | None

    def reachable(self) -> bool: ...

    def served_weight_version(self) -> str: ...

    def pause_generation(self) -> bool: ...

    def continue_generation(self) -> bool: ...

    def begin_weight_update(self) -> bool: ...

    def end_weight_update(self) -> bool: ...

    def init_weights_update_group(self, body: dict, *, timeout_s: float | None = None) -> dict: ...

    def update_weights_from_distributed(self, body: dict, *, timeout_s: float | None = None) -> dict: ...

    def destroy_weights_update_group(self, group_name: str) -> bool: ...

    def close(self) -> None: ...
