"""Weight updates, health, model info and cache flush, as SGLang answers them."""

from __future__ import annotations

import pytest
import requests

pytestmark = pytest.mark.xdist_group("rollout_server")

BODY = {"text": "ab", "sampling_params": {"max_new_tokens": 6, "sampling_seed": 5}, "return_logprob": True}


def generate(served):
    resp = requests.post(served.url + "/generate", json=BODY, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_weight_update_changes_outputs_version_and_model_info(fake):
    before = generate(fake)
    resp = requests.post(
        fake.url + "/update_weights_from_disk",
        json={"model_path": "fake://salt/3", "weight_version": "7", "load_format": None},
    )
    assert resp.status_code == 200
    answer = resp.json()
    assert answer["success"] is True and answer["num_paused_requests"] == 0
    assert "Weight version updated to 7" in answer["message"]
    after = generate(fake)
    assert after["output_ids"] != before["output_ids"]
    assert after["meta_info"]["output_token_logprobs"] != before["meta_info"]["output_token_logprobs"]
    assert (before["meta_info"]["weight_version"], after["meta_info"]["weight_version"]) == ("0", "7")
    info = requests.get(fake.url + "/get_model_info").json()
    assert (info["model_path"], info["weight_version"], info["is_generation"]) == ("fake://salt/3", "7", True)
    assert requests.get(fake.url + "/get_weight_version").json() == {"weight_version": "7"}


def test_weight_update_without_version_keeps_the_version(fake):
    resp = requests.post(fake.url + "/update_weights_from_disk", json={"model_path": "fake://salt/2"})
    assert resp.json()["success"] is True
    assert fake.engine.control == ["update:0", "flush_cache"]  # flush_cache defaults to true
    assert generate(fake)["meta_info"]["weight_version"] == "0"


def test_failed_weight_update_is_a_400_and_changes_nothing(fake):
    before = generate(fake)
    resp = requests.post(
        fake.url + "/update_weights_from_disk",
        json={"model_path": "fake://nowhere", "weight_version": "9", "flush_cache": False},
    )
    assert resp.status_code == 400
    assert resp.json()["success"] is False
    assert "fake://nowhere: no such checkpoint" in resp.json()["message"]
    again = generate(fake)
    assert again["output_ids"] == before["output_ids"]
    assert again["meta_info"]["output_token_logprobs"] == before["meta_info"]["output_token_logprobs"]
    assert again["meta_info"]["weight_version"] == "0"
    info = requests.get(fake.url + "/get_model_info").json()
    assert (info["model_path"], info["weight_version"]) == ("fake://salt/0", "0")


def test_health_asks_the_engine_when_idle(fake):
    assert requests.get(fake.url + "/health").status_code == 200
    assert requests.get(fake.url + "/health_generate").status_code == 200
    assert fake.engine.control == ["health", "health"]
    fake.engine.healthy = False
    assert requests.get(fake.url + "/health").status_code == 503


def test_flush_cache_reaches_the_engine(fake):
    resp = requests.post(fake.url + "/flush_cache")
    assert resp.status_code == 200 and resp.text.startswith("Cache flushed")
    assert requests.get(fake.url + "/flush_cache").status_code == 200
    assert fake.engine.control == ["flush_cache", "flush_cache"]


def test_a_control_call_is_answered_only_once_the_engine_is_idle_again(fake):
    """The caller of a control call hears back after ``busy`` is cleared: a health probe it sends next asks
    the engine instead of reading a stale "busy" (done callbacks run the moment the answer is set)."""
    seen = []
    future = fake.server.scheduler.call(lambda engine: engine.health())
    future.add_done_callback(lambda _: seen.append(fake.server.scheduler.busy))
    assert future.result(timeout=30) is True
    assert seen == [False]
