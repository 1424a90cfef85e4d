"""The server under continuous batching: requests join the running batch and are answered when they end.

The engine here can hold its batch before a decoding step (``before_step``), so what runs beside what
does not depend on timing.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from server_kit import POLICY, tiny_model, wait_until

from ringzero.model.checkpoint import save_model
from ringzero.model.tolerances import tolerance
from ringzero.rollout.engine.continuous import ContinuousBatch
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.store import open_store
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


class HeldBatch(ContinuousBatch):
    def __init__(self, engine, compact_below):
        super().__init__(engine, compact_below)
        self.admitted, self.most_live = 0, 0

    def admit(self, requests_):
        self.admitted += 1
        return super().admit(requests_)

    def step(self):
        self.engine.before_step(self)
        self.most_live = max(self.most_live, self.live)
        super().step()


class SteppedEngine(EmbeddedEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[HeldBatch] = []
        self.before_step = lambda batch: None

    def open_batch(self, compact_below=None):
        self.batches.append(HeldBatch(self, self.compact_below))
        return self.batches[-1]


@pytest.fixture
def served():
    engine = SteppedEngine(tiny_model(0), TOK, POLICY, max_batch=16)
    server = RolloutServer(engine, TOK, model_path="random://seed-0")
    with ServerThread(server.app) as thread:
        server.url = thread.url
        yield server


def hold_first_step(engine) -> tuple[threading.Event, threading.Event]:
    """``(held, entered)``: the engine's first decoding step sets ``entered`` and waits for ``held``."""
    held, entered = threading.Event(), threading.Event()

    def before_step(batch):
        if not entered.is_set():
            entered.set()
            assert held.wait(60)

    engine.before_step = before_step
    return held, entered


def body(text: str, tokens: int, seed: int, **params) -> dict:
    return {
        "text": text,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": tokens, "sampling_seed": seed, "ignore_eos": True, **params},
    }


def alone(text: str, tokens: int, seed: int, **params):
    engine = EmbeddedEngine(tiny_model(0), TOK, POLICY)
    ((c,),) = engine.generate(
        [
            GenerateRequest(
                TOK.encode(text), SamplingParams(max_new_tokens=tokens, seed=seed, ignore_eos=True, **params)
            )
        ]
    )
    return c


def assert_matches(answer: dict, want) -> None:
    assert answer["output_ids"] == want.output_ids
    tol = tolerance(torch.float32)
    got = [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64),
        torch.tensor(want.output_logprobs, dtype=torch.float64),
        atol=tol.atol,
        rtol=tol.rtol,
    )


def post(server, json: dict, pool: ThreadPoolExecutor):
    return pool.submit(requests.post, server.url + "/generate", json=json, timeout=60)


def test_concurrent_clients_get_what_each_request_gets_alone(served):
    work = [
        (f"{i}+{j}=", 3 + (5 * i + 3 * j) % 14, 10 * i + j, {"temperature": 0} if j == 1 else {"top_p": 0.9})
        for i in range(8)
        for j in range(3)
    ]

    def client(i: int):  # closed loop: each client sends its next request once the last one is answered
        return [
            requests.post(served.url + "/generate", json=body(t, n, s, **p), timeout=60).json()
            for t, n, s, p in work[3 * i : 3 * i + 3]
        ]

    with ThreadPoolExecutor(8) as pool:
        answers = [a for got in pool.map(client, range(8)) for a in got]
    for answer, (text, tokens, seed, params) in zip(answers, work, strict=True):
        assert_matches(answer, alone(text, tokens, seed, **params))
    assert served.scheduler.engine.batches[-1].most_live > 1, "requests should have shared decoding steps"


def test_a_request_joins_a_running_batch_and_is_answered_before_it_ends(served):
    engine, held, short_done = served.scheduler.engine, threading.Event(), threading.Event()
    entered = threading.Event()

    def before_step(batch):
        if not entered.is_set():
            entered.set()
            assert held.wait(60)
        elif batch.admitted == 2 and batch.live == 1:  # the short request has left; the long one decodes on
            short_done.wait(60)

    engine.before_step = before_step
    with ThreadPoolExecutor(4) as pool:
        long_ = post(served, body("long", 40, 1), pool)
        assert entered.wait(60)
        short = post(served, body("s", 3, 2), pool)
        wait_until(lambda: served.scheduler.pending() == 1, "the short request queued behind the held step")
        held.set()
        short_answer = short.result().json()
        assert not long_.done()
        short_done.set()
        long_answer = long_.result().json()
    assert_matches(short_answer, alone("s", 3, 2))
    assert_matches(long_answer, alone("long", 40, 1))


def test_abort_by_rid_cuts_a_row_of_the_running_batch(served):
    held, entered = hold_first_step(served.scheduler.engine)
    with ThreadPoolExecutor(4) as pool:
        running = post(
            served,
            {
                "text": ["ab", "cd"],
                "rid": "pair",
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
            },
            pool,
        )
        assert entered.wait(60)
        requests.post(served.url + "/abort_request", json={"rid": "pair_1"}, timeout=60)
        held.set()
        first, second = running.result().json()
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert second["meta_info"]["finish_reason"]["type"] == "abort"
    assert second["meta_info"]["finish_reason"]["message"] == "Aborted"
    assert 1 <= len(second["output_ids"]) < 8


def test_a_weight_update_waits_for_the_running_batch_and_keeps_its_place(served, tmp_path):
    uri = save_model(open_store(f"file://{tmp_path}/store"), "step-1", tiny_model(1))
    held, entered = hold_first_step(served.scheduler.engine)
    with ThreadPoolExecutor(4) as pool:
        before = post(served, body("ab", 6, 3), pool)
        assert entered.wait(60)
        update = pool.submit(
            requests.post,
            served.url + "/update_weights_from_disk",
            timeout=60,
            json={"model_path": uri, "weight_version": "1"},
        )
        wait_until(lambda: served.scheduler.pending() == 1, "the update queued")
        after = post(served, body("ab", 6, 3), pool)
        wait_until(lambda: served.scheduler.pending() == 2, "the second generate queued")
        held.set()
        before, after = before.result().json(), after.result().json()
        assert update.result().json()["success"] is True
    assert (before["meta_info"]["weight_version"], after["meta_info"]["weight_version"]) == ("0", "1")
    assert_matches(before, alone("ab", 6, 3))
    assert (
        after["output_ids"] != before["output_ids"]
        or after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    )
