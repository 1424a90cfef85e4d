"""A scripted fake engine, a tiny random HybridLM and small HTTP helpers for the server tests."""

from __future__ import annotations

import threading
import time

import requests
import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.rollout.types import Completion, GenerateRequest
from ringzero.tokenizer import CharTokenizer

# The fake continues every prompt with this text, cycled, from an offset set by seed, sample and weights.
SCRIPT = "ab;cd ef;gh\n"
REFUSED_CHAR = "!"  # a prompt holding it is refused with a RingzeroError (-> HTTP 400)
CRASH_CHAR = "?"  # a prompt holding it makes the engine crash (-> HTTP 500)


class FakeEngine:
    """A ``RolloutClient`` whose outputs are a pure function of (prompt, seed, sample index, weights).

    Weights are a "salt" loaded from ``fake://salt/<int>`` URIs; the salt shifts the script and the
    log-probs, so a weight update visibly changes outputs. ``gate``, when set, makes ``generate`` wait
    for it (after setting ``entered``), so tests can queue requests behind a running batch.
    """

    def __init__(self, tokenizer: CharTokenizer | None = None):
        self.tokenizer = tokenizer or CharTokenizer()
        self.salt = 0
        self.weight_version = "0"
        self.calls: list[list[GenerateRequest]] = []
        self.control: list[str] = []  # order of control calls, interleaved with "generate"
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.healthy = True

    def health(self) -> bool:
        self.control.append("health")
        return self.healthy

    def flush_cache(self) -> None:
        self.control.append("flush_cache")

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        prefix = "fake://salt/"
        if not uri.startswith(prefix) or not uri[len(prefix) :].isdigit():
            raise RingzeroError(f"{uri}: no such checkpoint")
        self.salt = int(uri[len(prefix) :])
        self.weight_version = str(weight_version)
        self.control.append(f"update:{weight_version}")

    def generate(self, requests: list[GenerateRequest]) -> list[list[Completion]]:
        self.calls.append(list(requests))
        self.control.append("generate")
        if self.gate is not None:
            self.entered.set()
            if not self.gate.wait(60):
                raise RuntimeError("test gate never opened")
        texts = [self.tokenizer.decode(r.input_ids) for r in requests]
        for text in texts:
            if REFUSED_CHAR in text:
                raise RingzeroError(f"prompt {text!r} refused")
            if CRASH_CHAR in text:
                raise ValueError("engine crashed")
        return [[self._sample(r, k) for k in range(r.params.n)] for r in requests]

    def _sample(self, req: GenerateRequest, k: int) -> Completion:
        p = req.params
        start = (p.seed or 0) * 7 + k * 3 + self.salt + len(req.input_ids)
        out, logps, text = [], [], ""
        for i in range(p.max_new_tokens):
            ch = SCRIPT[(start + i) % len(SCRIPT)]
            tid = self.tokenizer.encode(ch)[0]
            out.append(tid)
            logps.append(-1.0 - 0.125 * i - 0.5 * self.salt - 0.25 * k)
            text += ch
            if tid in p.stop_token_ids:
                return self._done(req, out, logps, "stop", tid)
            hit = next((s for s in p.stop if s in text), None)
            if hit is not None:
                return self._done(req, out, logps, "stop", hit)
        return self._done(req, out, logps, "length", None)

    def _done(self, req, out, logps, reason, matched) -> Completion:
        return Completion(list(req.input_ids), out, logps, reason, matched, self.weight_version)


TINY = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    layout="LM",
    intermediate_size=48,
    max_position_embeddings=48,
    kv_lora_rank=8,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    head_dim=8,
    lightning_block_size=4,
)
POLICY = PrecisionPolicy.preset("fp32")


def tiny_model(seed: int) -> HybridLM:
    """Order-1 random weights, so that different seeds give clearly different distributions."""
    model = HybridLM(ModelConfig.model_validate(TINY), POLICY)
    with torch.no_grad():
        random_weights_(model, torch.Generator().manual_seed(seed))
    return model


def same_samples(a: Completion, b: Completion) -> bool:
    """Equal as samples: everything but the transport-specific ``meta``."""
    return (
        a.prompt_ids,
        a.output_ids,
        a.output_logprobs,
        a.finish_reason,
        a.matched_stop,
        a.weight_version,
    ) == (b.prompt_ids, b.output_ids, b.output_logprobs, b.finish_reason, b.matched_stop, b.weight_version)


def wait_until(predicate, what: str, limit_s: float = 30.0) -> None:
    """Poll ``predicate``; the limit only keeps a broken scheduler from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.005)


def assert_clean(resp: requests.Response) -> None:
    """2xx, or a 4xx with SGLang's error object whose message starts with the field it names (and the same
    message under ``error``, the shape SGLang's ``/generate`` answers a refused input with)."""
    assert resp.status_code < 500, resp.text
    if resp.status_code < 300:
        if resp.content:
            resp.json()
        return
    assert 400 <= resp.status_code < 500
    err = resp.json()
    if "success" in err:  # a weight update that failed to load: SGLang's {success: false, message}
        assert err["success"] is False and err["message"]
        return
    assert err["object"] == "error" and err["code"] == resp.status_code and err["message"], err
    assert err["error"]["message"] == err["message"], err
    if err["param"] is not None:
        assert err["message"].startswith(err["param"] + ":"), err
