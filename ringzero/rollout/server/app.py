"""``ringzero serve``: any ``RolloutClient`` behind the subset of SGLang's HTTP API that RL needs.

Native endpoints (SGLang's names and shapes, so a real SGLang server is a drop-in for the client):

* ``POST /generate`` - ``text`` or ``input_ids`` (one prompt or a list), ``sampling_params`` (one
  object or one per prompt; ``max_new_tokens: 0`` scores the prompt only, ``ignore_eos``),
  ``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``, ``return_text_in_logprobs``, ``rid``,
  ``return_routed_experts`` (MoE models; ``meta_info.routed_experts``, see
  ``ringzero.rollout.server.format``) and
  ``routed_experts_start_len``.
  Answers ``{"text", "output_ids", "meta_info"}`` for one prompt with ``n == 1``, else a list of those,
  prompt-major (prompt ``i``'s ``n`` samples at ``i * n + j``), as SGLang expands ``n``.
* ``POST /update_weights_from_disk`` - ``{model_path, load_format?, weight_version?, flush_cache?,
  abort_all_requests?}`` -> ``{success, message, num_paused_requests}``, 400 when the load fails.
* ``POST /pause_generation``, ``/continue_generation``, ``/abort_request``, ``GET /get_server_info``
  (and ``/server_info``): see ``ringzero.rollout.server.control``.
* ``GET /health`` (and ``/health_generate``), ``GET /get_model_info``, ``GET /get_weight_version``,
  ``GET|POST /flush_cache``.
* ``POST /v1/completions`` - OpenAI legacy completions with ``logprobs`` (top-k dicts) and ``echo``.

Bad bodies get HTTP 400 whose message and ``param`` name the field, in both of SGLang's error shapes at
once: ``{"object": "error", "message", "type", "param", "code"}`` (its ``ErrorResponse``, what it answers a
body it cannot validate and what its OpenAI endpoints answer) plus ``"error": {"message", "type", "param",
"code"}`` (what its ``/generate`` answers a ``ValueError`` with, ``{"error": {"message"}}``, and OpenAI's
own shape). Text the tokenizer cannot encode is such a 400, naming the characters and their positions
(``text: 'T' at position 0 and 'F' at position 15 are not in the tokenizer's vocabulary, which has no
unknown token``): neither ringzero's char tokenizer nor its export has an unknown token, so the engine is
never handed a prompt that is not the client's. Anything that fails unexpectedly while answering is a 500
naming the exception (``ValueError: ...``), logged with its frames (never their local variables, see
``ringzero/logs.py``); the server serves on.

Limits (``ServerLimits`` in ``ringzero.rollout.server.schema``; ``ringzero serve`` flags of the same names):
``max_body_bytes`` (default 64 MiB) refuses a larger body with HTTP 413 from its Content-Length, or as
soon as a chunked body grows past it, before parsing; a body nested deeper than 32 levels is a 400.
``max_request_sequences`` (4096 prompts x ``n``), ``max_request_tokens`` (2**24 prompt tokens plus
``max_new_tokens`` over those sequences) and ``max_new_tokens`` (2**20, per prompt) refuse a
``/generate`` or ``/v1/completions`` request with a 400 naming the field; the server serves on. Concurrent
requests are batched by ``EngineScheduler`` (see ``ringzero.rollout.server.scheduler``), the only thread
that touches the engine: by default continuously (requests join the running batch between decoding
steps), or statically with ``batching="static"`` (``ringzero serve --batching static``).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ringzero.errors import RingzeroError
from ringzero.rollout.server.control import (
    GenerationGate,
    parse_abort,
    parse_continue,
    parse_pause,
    parse_weight_update,
    server_info,
)
from ringzero.rollout.server.format import EngineCrash, generate_item, sample_ids
from ringzero.rollout.server.openai import openai_completion, parse_completion
from ringzero.rollout.server.scheduler import EngineScheduler
from ringzero.rollout.server.schema import (
    BadRequest,
    BodyTooLarge,
    ServerLimits,
    check_depth,
    check_unicode,
    parse_generate,
)

log = structlog.get_logger(__name__)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")

BATCHING = ("continuous", "static")
HEALTH_TIMEOUT_S = 20.0  # SGLang's default health-check patience


class _AsciiJSON(JSONResponse):
    """JSON with non-ASCII characters escaped: an error may quote client text, which may hold anything."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    phrase = {
        400: "Bad Request",
        413: "Content Too Large",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }.get(status, "Error")
    error = {"message": message, "type": phrase, "param": param, "code": status}
    return _AsciiJSON({"object": "error", **error, "error": error}, status_code=status)


class _Unhandled:
    """ASGI middleware: an exception no handler took becomes a 500 naming it, logged with its frames (no
    locals), instead of reaching uvicorn as an unhandled error. Raised after the answer started, it is
    re-raised (nothing else can be sent)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watched(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            message = f"{type(exc).__name__}: {exc}"
            log.error("rollout.request_failed", path=scope.get("path"), error=message, exc_info=exc)
            await _error(500, message)(scope, receive, send)


async def _body(request: Request, limit: int, *, optional: bool = False):
    """The JSON body, at most ``limit`` bytes; with ``optional`` an empty body is None (clients post control
    calls without one). An oversized body is refused before it is read (Content-Length) or while it is."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge(
            "body",
            f"Content-Length {int(declared)} is over this server's limit of {limit} bytes (max_body_bytes)",
        )
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise BodyTooLarge("body", f"is over this server's limit of {limit} bytes (max_body_bytes)")
    if optional and not raw.strip():
        return None
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest("body", "nests too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike
        raise BadRequest("body", f"is not valid JSON ({exc})") from None
    check_depth(body)
    if _SURROGATE_ESCAPE.search(raw):  # only a \uD8xx-\uDFxx escape can put a surrogate in a string
        check_unicode(body)
    return body


class RolloutServer:
    """The FastAPI app over one engine; ``app`` can be served by uvicorn or ``ServerThread``."""

    def __init__(
        self,
        engine,
        tokenizer,
        *,
        model_path: str,
        tokenizer_path: str | None = None,
        weight_version: str | None = None,
        vocab_size: int | None = None,
        window_s: float = 0.005,
        max_batch_requests: int = 256,
        routing_shape: tuple[int, int] | None = None,
        limits: ServerLimits | None = None,
        batching: str = "continuous",
    ):
        """``routing_shape``: ``(num_hidden_layers, num_experts_per_tok)`` of the served MoE model, by default
        the engine's ``routing_shape``; without one ``return_routed_experts`` is refused (a dense model).
        ``limits``: what one request may ask (``ServerLimits()``'s generous defaults when None).
        ``batching``: ``continuous`` (requests join the running batch) or ``static`` (see
        ``ringzero.rollout.server.scheduler``)."""
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING} (got {batching!r})")
        self.limits = limits or ServerLimits()
        self.tokenizer = tokenizer
        self.routing_shape = routing_shape or getattr(engine, "routing_shape", None)
        self.vocab_size = vocab_size or tokenizer.vocab_size
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.weight_version = str(weight_version or getattr(engine, "weight_version", None) or "0")
        self.scheduler = EngineScheduler(
            engine,
            window_s=window_s,
            max_batch_requests=max_batch_requests,
            continuous=batching == "continuous",
        )
        self.gate = GenerationGate(self.scheduler)
        self.external_scheduler = False  # serve(): the caller runs the scheduler loop on its own thread
        self.app = self._build_app()

    async def _body(self, request: Request, *, optional: bool = False):
        return await _body(request, self.limits.max_body_bytes, optional=optional)

    def _context_length(self) -> int | None:
        value = getattr(self.scheduler.engine, "context_length", None)
        return value if isinstance(value, int) else None

    async def _engine(self, future):
        try:
            return await asyncio.wrap_future(future)
        except RingzeroError:
            raise
        except Exception as exc:
            raise EngineCrash(f"{type(exc).__name__}: {exc}") from exc

    def _build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_app):
            if not self.external_scheduler:
                self.scheduler.start()
            log.info("rollout.server_ready", model_path=self.model_path, weight_version=self.weight_version)
            try:
                yield
            finally:
                if not self.external_scheduler:
                    self.scheduler.stop()

        app = FastAPI(title="ringzero rollout server", lifespan=lifespan)
        app.add_middleware(_Unhandled)

        @app.exception_handler(BadRequest)
        async def _bad_request(_request: Request, exc: BadRequest):
            return _error(exc.status, str(exc), exc.field)

        @app.exception_handler(RingzeroError)
        async def _refused(_request: Request, exc: RingzeroError):
            # The engine refused the input (a prompt longer than the model's context, say).
            return _error(400, str(exc))

        @app.exception_handler(EngineCrash)
        async def _crash(request: Request, exc: EngineCrash):
            log.error("rollout.engine_failed", path=request.url.path, error=str(exc), exc_info=exc.__cause__)
            return _error(500, str(exc))

        app.add_api_route("/generate", self.generate, methods=["POST", "PUT"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/update_weights_from_disk", self.update_weights_from_disk, methods=["POST"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/health_generate", self.health, methods=["GET"])
        app.add_api_route("/get_model_info", self.model_info, methods=["GET"])
        app.add_api_route("/get_weight_version", self.get_weight_version, methods=["GET"])
        app.add_api_route("/flush_cache", self.flush_cache, methods=["GET", "POST"])
        app.add_api_route("/pause_generation", self.pause_generation, methods=["POST"])
        app.add_api_route("/continue_generation", self.continue_generation, methods=["POST"])
        app.add_api_route("/abort_request", self.abort_request, methods=["POST"])
        app.add_api_route("/get_server_info", self.server_info, methods=["GET"])
        app.add_api_route("/server_info", self.server_info, methods=["GET"])
        return app

    async def _run(self, requests):
        """Submit once admitted (a pause holds new work back) and wait for the engine's groups."""
        await self.gate.admitted()
        return await self._engine(self.scheduler.generate(requests))

    async def generate(self, request: Request) -> JSONResponse:
        plan = parse_generate(
            await self._body(request),
            self.tokenizer,
            self.vocab_size,
            self.routing_shape,
            self.limits,
            self._context_length(),
        )
        start = time.perf_counter()
        groups = await self._run(plan.requests)
        latency = time.perf_counter() - start
        items = []
        for i, (req, group) in enumerate(zip(plan.requests, groups, strict=True)):
            if len(group) != req.params.n:
                raise EngineCrash(f"engine returned {len(group)} completions for n={req.params.n}")
            for c, rid in zip(group, sample_ids(req.rid, req.params.n), strict=True):
                items.append(
                    generate_item(
                        c,
                        rid,
                        self.tokenizer,
                        plan.text_options[i],
                        req.logprobs,
                        return_logprob=plan.return_logprob[i],
                        text_in_logprobs=plan.text_in_logprobs,
                        e2e_latency=latency,
                        routed_from=plan.routed_from[i] if req.return_routed_experts else None,
                    )
                )
        return JSONResponse(items[0] if plan.single else items)

    async def completions(self, request: Request) -> JSONResponse:
        plan = parse_completion(
            await self._body(request), self.tokenizer, self.vocab_size, self.limits, self._context_length()
        )
        groups = await self._run(plan.requests)
        return JSONResponse(openai_completion(groups, self.tokenizer, plan))

    async def update_weights_from_disk(self, request: Request) -> JSONResponse:
        update = parse_weight_update(await self._body(request))
        # SGLang keeps the current version when the body names none.
        version = update.weight_version or self.weight_version

        def load(engine):
            engine.update_weights_from_disk(update.model_path, version)
            if update.flush_cache and hasattr(engine, "flush_cache"):
                engine.flush_cache()

        if update.abort_all_requests:
            # SGLang aborts the running requests before loading; here they would otherwise finish first.
            self.scheduler.abort(abort_all=True)
        try:
            await self._engine(self.scheduler.call(load))
        except Exception as exc:  # noqa: BLE001 - any failed load is the client's 400, as in SGLang
            # An unexpected failure (not a refusal) keeps its frames in the log; never their locals.
            log.warning(
                "rollout.weight_update_failed",
                model_path=update.model_path,
                error=str(exc),
                exc_info=None if isinstance(exc, RingzeroError) else exc.__cause__ or exc,
            )
            return JSONResponse(
                {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0},
                status_code=400,
            )
        self.weight_version, self.model_path = version, update.model_path
        message = "Succeeded to update model weights."
        if update.weight_version is not None:
            message += f" Weight version updated to {version}."
        log.info("rollout.weights_updated", model_path=update.model_path, weight_version=version)
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    async def health(self) -> Response:
        if not self.scheduler.alive:
            return Response(status_code=503)
        if self.scheduler.busy:
            # Working on a batch is alive; SGLang also skips its probe generation while busy.
            return Response(status_code=200)
        try:
            ok = await asyncio.wait_for(
                self._engine(self.scheduler.call(lambda e: e.health())), HEALTH_TIMEOUT_S
            )
        except Exception as exc:  # noqa: BLE001 - an unhealthy engine is a 503, not a crash
            log.warning("rollout.health_failed", error=str(exc))
            ok = False
        return Response(status_code=200 if ok else 503)

    async def model_info(self) -> dict:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }

    async def get_weight_version(self) -> dict:
        return {"weight_version": self.weight_version}

    async def flush_cache(self) -> PlainTextResponse:
        await self._engine(
            self.scheduler.call(lambda e: e.flush_cache() if hasattr(e, "flush_cache") else None)
        )
        return PlainTextResponse("Cache flushed.\n")

    async def pause_generation(self, request: Request) -> JSONResponse:
        mode = parse_pause(await self._body(request, optional=True))
        await self.gate.pause(mode)
        log.info("rollout.generation_paused", mode=mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> JSONResponse:
        parse_continue(await self._body(request, optional=True))
        self.gate.resume()
        log.info("rollout.generation_continued")
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def abort_request(self, request: Request) -> Response:
        req = parse_abort(await self._body(request, optional=True))
        hits = self.scheduler.abort(req.rid, abort_all=req.abort_all, message=req.message)
        log.info("rollout.requests_aborted", rid=req.rid, abort_all=req.abort_all, requests=hits)
        return Response(status_code=200)

    async def server_info(self) -> dict:
        return server_info(self)


class ServerThread:
    """Serve an app with uvicorn on a background thread, on a socket bound before start (port 0 = any).

    Binding first means the port is known and held before uvicorn runs: no free-port race in tests.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        import uvicorn

        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        # log_config=None: uvicorn logs through the root logger that ringzero's main() set up.
        config = uvicorn.Config(app, log_config=None, log_level=log_level, access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="rollout-http", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RingzeroError(f"rollout server on {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout_s: float = 30.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(server: RolloutServer, host: str, port: int, log_level: str = "info") -> None:
    """Serve in the foreground until SIGINT or SIGTERM: HTTP on a second thread, the engine on this one
    (the main thread: see ``EngineScheduler.run_here``)."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    server.external_scheduler = True
    http = ServerThread(server.app, host, port, log_level=log_level)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        http.start()
        server.scheduler.run_here()
    except KeyboardInterrupt:
        log.info("rollout.server_stopping")
    finally:
        http.stop()
        signal.signal(signal.SIGTERM, previous)
