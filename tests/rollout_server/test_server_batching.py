"""The scheduler: concurrent requests share one ``engine.generate``; control calls keep their place.

Each test holds the engine inside a first batch (the fake's ``gate``) and queues the requests under
test behind it, so what lands in which batch does not depend on timing.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from server_kit import REFUSED_CHAR, FakeEngine, wait_until

from ringzero.rollout.server.scheduler import EngineScheduler
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def body(prompt: str, tokens: int = 3) -> dict:
    return {"text": prompt, "sampling_params": {"max_new_tokens": tokens, "sampling_seed": 1}}


class Held:
    """Start one request that the engine holds until ``release()``; queue more behind it meanwhile."""

    def __init__(self, served, pool: ThreadPoolExecutor):
        self.served, self.pool, self.queued = served, pool, 0
        served.engine.gate = threading.Event()
        self.first = pool.submit(requests.post, served.url + "/generate", json=body("held"), timeout=60)
        wait_until(served.engine.entered.is_set, "the first batch reached the engine")

    def post(self, path: str, json: dict):
        future = self.pool.submit(requests.post, self.served.url + path, json=json, timeout=60)
        self.queued += 1
        wait_until(
            lambda: self.served.server.scheduler.pending() == self.queued, f"{self.queued} jobs queued"
        )
        return future

    def release(self) -> None:
        self.served.engine.gate.set()
        assert self.first.result().status_code == 200


def test_requests_queued_behind_a_batch_share_one_engine_call(fake):
    with ThreadPoolExecutor(8) as pool:
        held = Held(fake, pool)
        prompts = ["a", "bb", "ccc"]
        futures = [held.post("/generate", body(p, tokens=len(p) + 1)) for p in prompts]
        held.release()
        answers = [f.result().json() for f in futures]
    assert [len(call) for call in fake.engine.calls] == [1, 3]
    direct = FakeEngine()
    for prompt, answer in zip(prompts, answers, strict=True):
        (expected,) = direct.generate(
            [GenerateRequest(TOK.encode(prompt), SamplingParams(max_new_tokens=len(prompt) + 1, seed=1))]
        )[0]
        assert answer["output_ids"] == expected.output_ids  # each request got its own completions back


def test_a_weight_update_closes_the_batch_and_keeps_its_place(fake):
    with ThreadPoolExecutor(8) as pool:
        held = Held(fake, pool)
        before = held.post("/generate", body("a"))
        update = held.post(
            "/update_weights_from_disk", {"model_path": "fake://salt/5", "weight_version": "1"}
        )
        after = held.post("/generate", body("a"))
        held.release()
        before, after = before.result().json(), after.result().json()
        assert update.result().json()["success"] is True
    assert fake.engine.control == ["generate", "generate", "update:1", "flush_cache", "generate"]
    assert (before["meta_info"]["weight_version"], after["meta_info"]["weight_version"]) == ("0", "1")
    assert before["output_ids"] != after["output_ids"]


def test_a_bad_request_fails_alone_when_its_batch_fails(fake):
    with ThreadPoolExecutor(8) as pool:
        held = Held(fake, pool)
        good1 = held.post("/generate", body("a"))
        bad = held.post("/generate", body(f"b{REFUSED_CHAR}"))
        good2 = held.post("/generate", body("c"))
        held.release()
        codes = [f.result().status_code for f in (good1, bad, good2)]
    assert codes == [200, 400, 200]
    assert [len(call) for call in fake.engine.calls] == [1, 3, 1, 1, 1]  # merged, failed, re-run one by one


def test_batches_stop_growing_at_max_batch_requests():
    engine = FakeEngine()
    engine.gate = threading.Event()
    scheduler = EngineScheduler(engine, window_s=0.05, max_batch_requests=3)
    scheduler.start()
    try:
        first = scheduler.generate([GenerateRequest([5])])
        wait_until(engine.entered.is_set, "the first batch reached the engine")
        jobs = [scheduler.generate([GenerateRequest([5 + i]), GenerateRequest([6 + i])]) for i in range(3)]
        wait_until(lambda: scheduler.pending() == 3, "3 jobs queued")
        engine.gate.set()
        first.result(60)
        results = [job.result(60) for job in jobs]
    finally:
        scheduler.stop()
    # A job is never split: 2 + 2 prompts reach the cap of 3, the third job goes alone.
    assert scheduler.batch_sizes == [1, 4, 2]
    assert [[g[0].prompt_ids for g in r] for r in results] == [[[5 + i], [6 + i]] for i in range(3)]
