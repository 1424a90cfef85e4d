"""What the control endpoints read and do: weight updates, pause/continue, abort, server info (SGLang's
shapes).

* ``POST /pause_generation`` ``{"mode": "abort" | "retract" | "in_place"}`` (default abort; AReaL posts no
  body): new ``/generate`` and ``/v1/completions`` work waits until ``/continue_generation``. ``abort``
  also aborts every unanswered request (finish_reason ``abort`` with the tokens sampled so far) and
  answers once none is left, so a weight update that follows runs at once. ``retract`` and ``in_place``
  answer at once and let the running batch finish: this engine cannot freeze a batch mid-sequence, and
  finishing it keeps every completion on the weights it started with (SGLang resumes those requests
  after ``continue_generation``; here they are done by then).
* ``POST /continue_generation``: admits new work again.
* ``POST /abort_request`` ``{"rid", "abort_all", "abort_message"}``: aborts the unanswered requests with
  that rid (each prompt of a batch has its own, ``<rid>_<i>``; its ``n`` samples share it) or all of them;
  an unknown or already answered rid is a no-op, as in SGLang.
* ``GET /get_server_info`` (and ``/server_info``): server settings under SGLang's names, only those this
  server has, plus ``internal_states`` and ``version`` (ringzero's). The capacity fields clients size their
  batches by are the engine's: ``max_total_num_tokens`` (tokens it holds at once: rows decoded together
  times the context's positions), ``max_running_requests`` (rows decoded together; SGLang counts each of
  a request's ``n`` samples as one request), ``context_length`` and ``max_req_input_len`` (the longest
  prompt that leaves room to continue: ``context_length - 1``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ringzero.rollout.server.schema import BadRequest, bool_field, object_or_null, show


@dataclass
class WeightUpdate:
    model_path: str
    weight_version: str | None
    flush_cache: bool
    abort_all_requests: bool = False  # abort unanswered generations first instead of waiting for them


# No effect here: nothing is captured, cached on the device or loaded asynchronously. "abort_all_request"
# is AReaL's spelling (areal/engine/sglang_remote.py), which SGLang ignores as an unknown field.
_UPDATE_IGNORED = {"torch_empty_cache", "recapture_cuda_graph", "token_step", "is_async", "abort_all_request"}


def parse_weight_update(body: Any) -> WeightUpdate:
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    known = {"model_path", "load_format", "weight_version", "flush_cache", "abort_all_requests"}
    for name in body:
        if name not in known and name not in _UPDATE_IGNORED:
            raise BadRequest(name, "unknown field for /update_weights_from_disk")
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
        raise BadRequest("model_path", f"must be a non-empty checkpoint URI (got {show(path)})")
    load_format = body.get("load_format")
    if load_format not in (None, "auto", "safetensors"):
        raise BadRequest("load_format", f"must be null, 'auto' or 'safetensors' (got {show(load_format)})")
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str):
        raise BadRequest("weight_version", f"must be a string (got {show(version)})")
    flush, abort = body.get("flush_cache"), body.get("abort_all_requests")
    return WeightUpdate(
        path,
        version,
        True if flush is None else bool_field(flush, "flush_cache"),
        False if abort is None else bool_field(abort, "abort_all_requests"),
    )


# --- /pause_generation, /continue_generation, /abort_request --------------------------------------

PAUSE_MODES = ("abort", "retract", "in_place")


def parse_pause(body: Any) -> str:
    """SGLang's ``PauseGenerationReqInput``: ``{"mode"}``, default abort; AReaL posts no body at all."""
    if body is None:
        return "abort"
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for name, value in body.items():
        if name == "rid":  # BaseReq's, in SGLang's struct: a pause holds every request alike
            if value is not None and not isinstance(value, str):
                raise BadRequest("rid", f"must be a string (got {show(value)})")
        elif name != "mode":
            raise BadRequest(name, "unknown field for /pause_generation")
    mode = body.get("mode") or "abort"
    if mode not in PAUSE_MODES:
        raise BadRequest("mode", f"must be one of {', '.join(PAUSE_MODES)} (got {show(mode)})")
    return mode


def parse_continue(body: Any) -> None:
    """SGLang's ``ContinueGenerationReqInput``: ``torch_empty_cache`` (no effect here) or nothing."""
    if body is None:
        return
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for name, value in body.items():
        if name != "torch_empty_cache":
            raise BadRequest(name, "unknown field for /continue_generation")
        if value is not None:
            bool_field(value, name)


@dataclass
class AbortRequest:
    rid: str | None
    abort_all: bool
    message: str | None


def parse_abort(body: Any) -> AbortRequest:
    """SGLang's ``AbortReq``: ``{"rid", "abort_all", "abort_message"}``; verl sends ``rid: ""``."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise BadRequest("body", "must be a JSON object")
    for name in body:
        if name not in ("rid", "abort_all", "abort_message", "finished_reason"):
            raise BadRequest(name, "unknown field for /abort_request")
    rid, abort_all, message = body.get("rid"), body.get("abort_all"), body.get("abort_message")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("rid", f"must be a string (got {show(rid)})")
    if message is not None and not isinstance(message, str):
        raise BadRequest("abort_message", f"must be a string (got {show(message)})")
    object_or_null(body.get("finished_reason"), "finished_reason")
    return AbortRequest(
        rid or None, False if abort_all is None else bool_field(abort_all, "abort_all"), message
    )


class GenerationGate:
    """Admission of new generations, paused and continued from the event loop that serves the HTTP API."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.mode: str | None = None  # the pause mode while paused
        self._loop = None
        self._open: asyncio.Event | None = None

    @property
    def paused(self) -> bool:
        return self.mode is not None

    def _event(self) -> asyncio.Event:
        # An asyncio.Event belongs to one loop; a server served again (a new uvicorn run) gets a new one.
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._open = loop, asyncio.Event()
            if not self.paused:
                self._open.set()
        return self._open

    async def admitted(self) -> None:
        await self._event().wait()

    async def pause(self, mode: str, poll_s: float = 0.005) -> None:
        self.mode = mode
        self._event().clear()
        if mode != "abort":
            return
        # Abort until nothing unanswered is left (SGLang loops the same way): requests admitted just
        # before the pause may reach the scheduler after a first abort.
        while True:
            self.scheduler.abort(abort_all=True)
            waiting, running = self.scheduler.live_requests()
            if waiting + running == 0:
                return
            await asyncio.sleep(poll_s)

    def resume(self) -> None:
        self.mode = None
        self._event().set()


def _version() -> str:
    try:
        return metadata.version("ringzero")
    except metadata.PackageNotFoundError:
        return "unknown"


def _int_attr(engine, name: str) -> int | None:
    value = getattr(engine, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def server_info(server) -> dict:
    """SGLang's ``/get_server_info`` keys that describe this server; the rest are left out, not faked."""
    engine, scheduler = server.scheduler.engine, server.scheduler
    policy = getattr(engine, "policy", None)
    waiting, running = scheduler.live_requests()
    info: dict[str, Any] = {
        "model_path": server.model_path,
        "tokenizer_path": server.tokenizer_path,
        "served_model_name": server.model_path,
        "weight_version": server.weight_version,
        "is_embedding": False,
        "skip_tokenizer_init": False,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "ep_size": 1,
        "nnodes": 1,
        "node_rank": 0,
        "max_running_requests": _int_attr(engine, "max_batch") or scheduler.max_batch_requests,
        "disaggregation_mode": "null",
        "enable_lora": False,
    }
    if policy is not None:
        info["dtype"] = str(policy.body)
        info["enable_fp32_lm_head"] = bool(policy.lm_head_fp32)
    for key, attr in (
        ("enable_deterministic_inference", "deterministic"),
        ("random_seed", "seed"),
        ("context_length", "context_length"),
    ):
        value = getattr(engine, attr, None)
        if value is not None:
            info[key] = value
    context, rows = _int_attr(engine, "context_length"), _int_attr(engine, "max_batch")
    capacity = _int_attr(engine, "max_total_num_tokens") or (rows * context if rows and context else None)
    if capacity is not None:
        info["max_total_num_tokens"] = capacity
    if context is not None:
        info["max_req_input_len"] = min(context, capacity or context) - 1
    info["internal_states"] = [
        {
            "last_gen_throughput": scheduler.last_gen_throughput,
            "engine_paused": server.gate.paused,
            "waiting_queue_size": waiting,
            "running_batch_size": running,
        }
    ]
    info["version"] = _version()
    return info
