"""Servers on 127.0.0.1 (uvicorn on a thread, socket bound to a free port first) over a fake or real
engine."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from server_kit import POLICY, FakeEngine, tiny_model

from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.tokenizer import CharTokenizer

torch.set_num_threads(1)


@dataclass
class Served:
    url: str
    engine: object
    server: RolloutServer


def _serve(engine, **kwargs):
    server = RolloutServer(
        engine, CharTokenizer(), model_path=kwargs.pop("model_path", "fake://salt/0"), **kwargs
    )
    thread = ServerThread(server.app)
    thread.start()
    return Served(thread.url, engine, server), thread


@pytest.fixture
def fake():
    """A fresh fake engine behind a fresh server (tests here may change weights or block the engine)."""
    served, thread = _serve(FakeEngine())
    yield served
    if served.engine.gate is not None:
        served.engine.gate.set()
    thread.stop()


@pytest.fixture(scope="module")
def fake_shared():
    """One fake server per module, for tests that only read."""
    served, thread = _serve(FakeEngine())
    yield served
    thread.stop()


def _real(deterministic: bool, batching: str = "continuous"):
    engine = EmbeddedEngine(tiny_model(0), CharTokenizer(), POLICY, max_batch=16, deterministic=deterministic)
    served, thread = _serve(engine, model_path="random://seed-0", batching=batching)
    yield served
    thread.stop()


@pytest.fixture
def real():
    """The embedded engine on a tiny random model (seed 0), behind a server."""
    yield from _real(deterministic=False)


@pytest.fixture
def real_static():
    """As ``real``, batching statically (a batch decodes to its end while newcomers wait)."""
    yield from _real(deterministic=False, batching="static")


@pytest.fixture
def real_deterministic():
    """As ``real``, with batch-invariant log-probs."""
    yield from _real(deterministic=True)
