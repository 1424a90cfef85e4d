"""``HttpRolloutClient``: the ``RolloutClient`` protocol over SGLang's native HTTP API.

The same bodies work against ``ringzero serve`` and a real SGLang server: requests go out as one
batched ``/generate`` per distinct ``n`` (SGLang refuses a batch whose prompts disagree on ``n``) and
``return_routed_experts`` (one flag per body in SGLang), with ``return_logprob`` on, and come back
prompt-major (prompt ``i``'s samples at ``i * n + j``). ``GenerateRequest.logprobs`` travels as
``logprob_start_len`` / ``top_logprobs_num``: one value, or a list per prompt when ``n == 1`` (SGLang refuses
lists with ``n > 1``, so those batches are also split by these settings); the answer's prompt log-probs and
top-k alternatives come back in the ``Completion``'s fields. ``prompt_temperature_scaled`` is not sent
(SGLang's ``GenerateReqInput`` has no such field).

Routed experts (``GenerateRequest.return_routed_experts``, MoE models): SGLang answers
``meta_info["routed_experts"]``, the base64 of an int32 array's bytes without its shape, so the client needs
the model's ``routing_shape=(num_hidden_layers, num_experts_per_tok)`` (as SGLang's RL clients pass
``num_layers`` / ``moe_router_topk``; ``EmbeddedEngine.routing_shape`` gives it for a model); a request
that asks without it is refused before anything is sent. The decoded ``Completion.routed_experts`` is a
CPU int32 tensor ``[len(prompt) + len(output) - 1, num_hidden_layers, num_experts_per_tok]`` (slime's
decoding: ``np.frombuffer(b64decode(...), np.int32).reshape(len(tokens) - 1, num_layers, topk)`` in
``slime/rollout/sglang_rollout.py``). A real SGLang server returns the field only when launched with
``--enable-return-routed-experts``; an answer without it is an error (unless aborted before any token).

Connection failures and 5xx answers are retried ``retries`` times with a short backoff (a sample
drawn twice is still a fair sample); a 4xx is the caller's fault and raised at once. Every failure
is a ``RingzeroError`` naming the endpoint and, when the server gave one, its message.

Seeds: ``SamplingParams.seed`` travels as SGLang's ``sampling_seed``. SGLang gives all ``n`` copies
of a request the same seed, so a real SGLang server returns ``n`` identical samples for a seeded
request with ``n > 1``; leave ``seed`` unset there when samples must differ.

Every body is built by one function here, named after the SGLang request it matches
(``python/sglang/srt/managers/io_struct.py``): ``GenerateReqInput``, ``UpdateWeightFromDiskReqInput``,
``InitWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``, ``PauseGenerationReqInput``.
``tests/rollout/test_sglang_pairs.py`` checks them against SGLang's own fields. This client talks to one
server; ``ringzero.rollout.replicas.replica_set.ReplicaSet`` drives several and orders a weight push
(pause, update, continue) across them.
"""

from __future__ import annotations

import base64
import math
import time
import uuid

import numpy as np
import requests
import torch

from ringzero.errors import RingzeroError, ServerUnreachable
from ringzero.rollout.types import Completion, GenerateRequest, LogprobRequest, SamplingParams


def sampling_params_body(p: SamplingParams) -> dict:
    body = {
        "max_new_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        # SGLang spells "no top-k" as -1; 0 is refused there.
        "top_k": p.top_k if p.top_k > 0 else -1,
        "n": p.n,
    }
    if p.stop:
        body["stop"] = list(p.stop)
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.seed is not None:
        body["sampling_seed"] = p.seed
    if p.ignore_eos:
        body["ignore_eos"] = True
    return body


def _start_len(lp: LogprobRequest) -> int:
    return -1 if lp.prompt_from is None else lp.prompt_from  # SGLang's -1: output tokens only


def _one_or_each(values: list):
    return values[0] if len(set(values)) == 1 else values


MAX_SEQUENCES_PER_POST = 1024
"""Sequences (prompts x n) one ``/generate`` POST asks for: a stage's batch (a distill set of 4096 prompts
x 8) is split into requests under the server's own per-request limit (``ringzero serve``'s default 4096)."""


def generate_body(requests_: list[GenerateRequest]) -> dict:
    """``GenerateReqInput`` for one batch whose requests share ``n`` (SGLang refuses mixed ``n``).

    ``rid`` holds one id per prompt: SGLang gives each of the ``n`` samples its own id in ``meta_info.id``.
    Prompt log-probs, top-k and routed experts are sent only when some request asks; with ``n > 1`` the
    requests of a batch must agree on them (``HttpRolloutClient.generate`` splits batches so).
    """
    body = {
        "input_ids": [list(r.input_ids) for r in requests_],
        "sampling_params": [sampling_params_body(r.params) for r in requests_],
        "return_logprob": True,
        "rid": [r.rid or uuid.uuid4().hex for r in requests_],
    }
    if any(r.logprobs.prompt_from is not None for r in requests_):
        body["logprob_start_len"] = _one_or_each([_start_len(r.logprobs) for r in requests_])
    if any(r.logprobs.top_k for r in requests_):
        body["top_logprobs_num"] = _one_or_each([r.logprobs.top_k for r in requests_])
    if any(r.return_routed_experts for r in requests_):
        # GenerateReqInput.return_routed_experts is one bool for the whole body (io_struct.py).
        body["return_routed_experts"] = True
    return body


def _batch_key(r: GenerateRequest) -> tuple:
    """Requests that may share one ``/generate`` body: same ``n`` and routed-experts flag and, with ``n > 1``,
    the same log-prob settings (SGLang: "Cannot use list logprob_start_len with parallel_sample_num > 1")."""
    key = (r.params.n, r.return_routed_experts)
    return key + (_start_len(r.logprobs), r.logprobs.top_k) if r.params.n > 1 else key


def disk_update_body(model_path: str, weight_version: str) -> dict:
    """``UpdateWeightFromDiskReqInput``. ``load_format`` is left out: SGLang then uses its own
    ``--load-format``."""
    return {
        "model_path": model_path,
        "weight_version": str(weight_version),
        "flush_cache": True,
        "abort_all_requests": False,
    }


PAUSE_BODY = {"mode": "abort"}
"""``PauseGenerationReqInput``. A push happens between sampling phases, when nothing should be in flight:
``abort`` ends anything that still is (it comes back as ``finish_reason: abort``, and its version is the old
one) instead of letting it resume on new weights with tokens from two versions."""


_DECODED = (
    "output_token_logprobs",
    "finish_reason",
    "input_token_logprobs",
    "output_top_logprobs",
    "input_top_logprobs",
    "routed_experts",
)


def _logprob(value) -> float:
    return (
        -math.inf if value is None else float(value)
    )  # JSON null: -inf (SGLang's orjson writes no infinity)


def _tops(entries) -> list[list[tuple[float, int]] | None]:
    """Per position, ``[logprob, token_id, text]`` triples -> (logprob, token_id) pairs (None stays None)."""
    return [None if top is None else [(_logprob(e[0]), int(e[1])) for e in top] for top in entries]


def _routed_experts(raw, fed: int, shape: tuple[int, int], where: str) -> torch.Tensor:
    """SGLang's base64 int32 bytes -> ``[fed, num_layers, topk]`` (routed_experts_capturer.py's
    ``extract_routed_experts_from_meta_info``, reshaped as slime does)."""
    try:
        flat = np.frombuffer(base64.b64decode(raw, validate=True), dtype="<i4")
    except (TypeError, ValueError) as exc:
        raise RingzeroError(f"{where}: meta_info.routed_experts is not base64 ({exc})") from None
    layers, k = shape
    if flat.size != fed * layers * k:
        raise RingzeroError(
            f"{where}: meta_info.routed_experts holds {flat.size} expert ids; {fed} fed tokens x "
            f"{layers} layers x top-{k} needs {fed * layers * k}"
        )
    return torch.from_numpy(flat.astype(np.int32).reshape(fed, layers, k))


def _completion(
    item: dict,
    req: GenerateRequest,
    where: str,
    routing_shape: tuple[int, int] | None = None,
) -> Completion:
    lp = req.logprobs
    try:
        meta = item["meta_info"]
        output_ids = [int(t) for t in item["output_ids"]]
        entries = meta.get("output_token_logprobs") or []
        logprobs = [_logprob(e[0]) for e in entries]
        reason = meta["finish_reason"] or {"type": "abort"}
        output_top = _tops(meta.get("output_top_logprobs") or []) if lp.top_k else None
        prompt = prompt_top = None
        if lp.prompt_from is not None and "input_token_logprobs" in meta:
            prompt = [None if j == 0 else _logprob(e[0]) for j, e in enumerate(meta["input_token_logprobs"])]
            prompt_top = _tops(meta.get("input_top_logprobs") or [None] * len(prompt)) if lp.top_k else None
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise RingzeroError(f"{where}: unexpected /generate item ({exc!r}): {str(item)[:200]}") from None
    if len(logprobs) != len(output_ids):
        raise RingzeroError(f"{where}: {len(logprobs)} log-probs for {len(output_ids)} output tokens")
    kind = reason.get("type")
    if kind not in ("stop", "length", "abort"):
        raise RingzeroError(f"{where}: unknown finish_reason {reason!r}")
    experts = None
    if req.return_routed_experts:
        if meta.get("routed_experts") is not None:
            experts = _routed_experts(
                meta["routed_experts"], len(req.input_ids) + len(output_ids) - 1, routing_shape, where
            )
        elif not (kind == "abort" and not output_ids):
            raise RingzeroError(
                f"{where}: asked for routed experts, the answer has none (an SGLang server needs "
                "--enable-return-routed-experts)"
            )
    extra = {k: v for k, v in meta.items() if k not in _DECODED}
    if kind == "abort":
        extra["message"] = reason.get("message")
    return Completion(
        prompt_ids=list(req.input_ids),
        output_ids=output_ids,
        output_logprobs=logprobs,
        finish_reason=kind,
        matched_stop=reason.get("matched"),
        weight_version=str(meta.get("weight_version", "")),
        meta=extra,
        output_top_logprobs=output_top,
        prompt_logprobs=prompt,
        prompt_top_logprobs=prompt_top,
        routed_experts=experts,
    )


class HttpRolloutClient:
    """``RolloutClient`` against ``endpoint`` (``http://host:port`` of ringzero serve or SGLang).

    ``routing_shape``: ``(num_hidden_layers, num_experts_per_tok)`` of the served MoE model, needed to decode
    routed experts (see the module docstring); it may also be set on the attribute later.
    """

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 600.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        *,
        routing_shape: tuple[int, int] | None = None,
    ):
        if not endpoint.startswith(("http://", "https://")):
            raise RingzeroError(f"rollout endpoint must start with http:// or https:// (got {endpoint!r})")
        self.routing_shape = routing_shape
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def _request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> requests.Response:
        url = f"{self.endpoint}{path}"
        attempts = 1 + (self.retries if retries is None else retries)
        problem = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                resp = self._session.request(method, url, json=body, timeout=timeout_s or self.timeout_s)
            except requests.RequestException as exc:
                problem = f"cannot reach the rollout server ({type(exc).__name__}: {exc})"
                continue
            if resp.status_code < 500:
                return resp
            problem = f"HTTP {resp.status_code}: {_message(resp)}"
        raise ServerUnreachable(f"{method} {url}: {problem} (after {attempts} attempt(s))")

    def _json(self, method: str, path: str, body: dict | None = None):
        resp = self._request(method, path, body)
        if resp.status_code >= 400:
            raise RingzeroError(f"{method} {self.endpoint}{path}: HTTP {resp.status_code}: {_message(resp)}")
        try:
            return resp.json()
        except ValueError:
            raise RingzeroError(
                f"{method} {self.endpoint}{path}: answer is not JSON: {resp.text[:200]!r}"
            ) from None

    # --- RolloutClient ---

    def generate(self, requests_: list[GenerateRequest]) -> list[list[Completion]]:
        where = f"POST {self.endpoint}/generate"
        if self.routing_shape is None and any(r.return_routed_experts for r in requests_):
            raise RingzeroError(
                f"{where}: return_routed_experts needs the client's routing_shape=(num_hidden_layers, "
                "num_experts_per_tok) to decode the answer"
            )
        results: list[list[Completion] | None] = [None] * len(requests_)
        batches: dict[tuple, list[int]] = {}
        for i, req in enumerate(requests_):
            batches.setdefault(_batch_key(req), []).append(i)
        for same_key in batches.values():
            n = requests_[same_key[0]].params.n
            per_post = max(1, MAX_SEQUENCES_PER_POST // n)
            for start in range(0, len(same_key), per_post):
                self._generate_batch(requests_, same_key[start : start + per_post], results, where)
        return results  # type: ignore[return-value]

    def _generate_batch(self, requests_, indices: list[int], results: list, where: str) -> None:
        group = [requests_[i] for i in indices]
        n = group[0].params.n
        items = self._json("POST", "/generate", generate_body(group))
        if not isinstance(items, list) or len(items) != len(group) * n:
            got = len(items) if isinstance(items, list) else type(items).__name__
            raise RingzeroError(f"{where}: expected {len(group) * n} items, got {got}")
        for k, i in enumerate(indices):
            results[i] = [
                _completion(items[k * n + j], requests_[i], where, self.routing_shape) for j in range(n)
            ]

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        """``model_path`` as given: a local folder for SGLang, a store URI for ``ringzero serve``."""
        # Retried like any call: loading the same folder twice is harmless.
        self._update(
            "/update_weights_from_disk",
            disk_update_body(uri, weight_version),
            f"{uri}, version {weight_version}",
            retries=None,
        )

    # --- weight pushes (SGLang's RL endpoints) ---

    def _update(
        self, path: str, body: dict, what: str, *, timeout_s: float | None = None, retries: int | None = 0
    ) -> dict:
        """POST an update; SGLang answers ``{"success": bool, "message": str}`` (HTTP 400 on failure).

        Not retried by default: a group join or a broadcast happens once, on both sides.
        """
        resp = self._request("POST", path, body, timeout_s=timeout_s, retries=retries)
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if resp.status_code != 200 or not answer.get("success", False):
            raise RingzeroError(
                f"POST {self.endpoint}{path} ({what}): HTTP {resp.status_code}: "
                f"{answer.get('message') or _message(resp)}"
            )
        return answer

    def _control(self, path: str, body: dict) -> bool:
        """POST a control call; ``False`` when the server has no such endpoint (HTTP 404), an error
        otherwise."""
        resp = self._request("POST", path, body, retries=0)
        if resp.status_code == 404:
            return False
        if resp.status_code != 200:
            raise RingzeroError(f"POST {self.endpoint}{path}: HTTP {resp.status_code}: {_message(resp)}")
        try:
            answer = resp.json()
        except ValueError:
            return True
        if isinstance(answer, dict) and answer.get("success") is False:
            raise RingzeroError(f"POST {self.endpoint}{path}: {answer.get('message') or answer}")
        return True

    def pause_generation(self) -> bool:
        return self._control("/pause_generation", dict(PAUSE_BODY))

    def continue_generation(self) -> bool:
        return self._control("/continue_generation", {})

    def begin_weight_update(self) -> bool:
        """Open SGLang's weight-update session (servers from mid-2026 on); ``False`` on servers without
        one."""
        return self._control("/begin_weight_update", {"selector": "all"})

    def end_weight_update(self) -> bool:
        return self._control("/end_weight_update", {})

    def init_weights_update_group(self, body: dict, *, timeout_s: float | None = None) -> dict:
        """Blocks until every rank of the group joined (the server's answer comes after its ranks did)."""
        return self._update(
            "/init_weights_update_group",
            body,
            f"group {body.get('group_name')}, rank_offset "
            f"{body.get('rank_offset')} of {body.get('world_size')}",
            timeout_s=timeout_s,
        )

    def update_weights_from_distributed(self, body: dict, *, timeout_s: float | None = None) -> dict:
        """Blocks until the server received every tensor of ``body['names']`` and loaded them."""
        return self._update(
            "/update_weights_from_distributed",
            body,
            f"{len(body.get('names', []))} tensors, version {body.get('weight_version')}",
            timeout_s=timeout_s,
        )

    def health(self) -> bool:
        try:
            return self._request("GET", "/health", timeout_s=30.0, retries=0).status_code == 200
        except RingzeroError:
            return False

    def reachable(self) -> bool:
        """The server answers at all (any status below 500 on ``/health``): not gone or restarting."""
        try:
            self._request("GET", "/health", timeout_s=30.0, retries=0)
        except ServerUnreachable:
            return False
        return True

    # --- the rest of the native API the RL loop may want ---

    def model_info(self) -> dict:
        return self._json("GET", "/get_model_info")

    def served_weight_version(self) -> str:
        """The weight version the server holds now: ``/model_info`` (SGLang 0.5.23), else ``/get_model_info``
        (older SGLang, ``ringzero serve``)."""
        resp = self._request("GET", "/model_info", timeout_s=30.0, retries=0)
        if resp.status_code == 404:
            resp = self._request("GET", "/get_model_info", timeout_s=30.0, retries=0)
        if resp.status_code != 200:
            raise RingzeroError(f"GET {self.endpoint}/model_info: HTTP {resp.status_code}: {_message(resp)}")
        try:
            return str(resp.json()["weight_version"])
        except (ValueError, KeyError, TypeError):
            raise RingzeroError(
                f"GET {self.endpoint}/model_info: no weight_version in {resp.text[:200]!r}"
            ) from None

    def destroy_weights_update_group(self, group_name: str) -> bool:
        """Leave a weight group (SGLang's ``/destroy_weights_update_group``); ``False`` where there is
        none."""
        return self._control("/destroy_weights_update_group", {"group_name": group_name})

    def flush_cache(self) -> None:
        resp = self._request("POST", "/flush_cache")
        if resp.status_code != 200:
            raise RingzeroError(
                f"POST {self.endpoint}/flush_cache: HTTP {resp.status_code}: {_message(resp)}"
            )


def _message(resp: requests.Response) -> str:
    """The server's own words: SGLang answers ``{"message": ...}`` or ``{"error": {"message": ...}}``."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:500] or resp.reason
    if isinstance(body, dict):
        if isinstance(body.get("error"), dict) and "message" in body["error"]:
            return str(body["error"]["message"])
        if "message" in body:
            return str(body["message"])
    return str(body)[:500]
