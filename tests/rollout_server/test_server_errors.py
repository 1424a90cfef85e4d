"""Bad bodies get HTTP 400 with SGLang's ErrorResponse whose message and ``param`` name the field."""

from __future__ import annotations

import pytest
import requests
from server_kit import CRASH_CHAR, REFUSED_CHAR

pytestmark = pytest.mark.xdist_group("rollout_server")

ONE = {"max_new_tokens": 1}


@pytest.mark.parametrize("body, field", [
    ({"text": "a", "sampling_params": {"max_new_tokens": 1, "temprature": 0.5}}, "sampling_params.temprature"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": True}}, "sampling_params.max_new_tokens"),
    ({"text": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"text": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"text": "a", "sampling_params": {"top_k": -2}}, "sampling_params.top_k"),
    ({"text": "a", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"text": "a", "sampling_params": {"stop": ["ok", 3]}}, "sampling_params.stop"),
    ({"text": "a", "sampling_params": {"stop": ""}}, "sampling_params.stop"),
    ({"text": "a", "sampling_params": {"stop_token_ids": [-1]}}, "sampling_params.stop_token_ids[0]"),
    ({"text": "a", "sampling_params": {"frequency_penalty": 0.5}}, "sampling_params.frequency_penalty"),
    ({"text": "a", "sampling_params": {"regex": "[0-9]+"}}, "sampling_params.regex"),
    ({"text": ["a", "b"], "sampling_params": [ONE, {"max_new_tokens": 1, "bogus": 1}]}, "sampling_params[1].bogus"),
    ({"text": ["a", "b"], "sampling_params": [ONE]}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 2}]}, "sampling_params"),
    ({"text": "a", "input_ids": [5]}, "text"),
    ({"sampling_params": ONE}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [[5], []]}, "input_ids[1]"),
    ({"input_ids": [5, "x"]}, "input_ids[1]"),
    ({"input_ids": [5, 64]}, "input_ids"),
    ({"text": "A"}, "text"),  # not in the char alphabet
    ({"text": "a", "stream": True}, "stream"),
    ({"text": "a", "image_data": "cat.png"}, "image_data"),
    ({"text": ["a", "b"], "image_data": [None, "cat.png"]}, "image_data"),
    ({"text": "a", "top_logprobs_num": 65, "return_logprob": True}, "top_logprobs_num"),  # vocab is 64
    ({"text": "a", "top_logprobs_num": -1, "return_logprob": True}, "top_logprobs_num"),
    ({"text": "a", "logprob_start_len": -2, "return_logprob": True}, "logprob_start_len"),
    ({"text": "ab", "logprob_start_len": 2, "return_logprob": True}, "logprob_start_len"),  # past the prompt
    ({"text": ["a", "bc"], "logprob_start_len": [0, 5], "return_logprob": True}, "logprob_start_len[1]"),
    ({"text": "a", "custom_logit_processor": "{\"callable\": \"...\"}"}, "custom_logit_processor"),
    ({"text": "a", "sampling_params": {"custom_params": "x"}}, "sampling_params.custom_params"),
    ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "sampling_params.ignore_eos"),
    ({"text": "a", "routed_dp_rank": 1}, "routed_dp_rank"),  # one data-parallel rank
    ({"text": "a", "bootstrap_host": "10.0.0.1"}, "bootstrap_host"),  # no prefill/decode disaggregation
    ({"text": "a", "lora_path": "adapter"}, "lora_path"),
    ({"text": "a", "return_logprob": "yes"}, "return_logprob"),
    ({"text": ["a", "b"], "rid": ["same", "same"]}, "rid"),
    ({"text": "a", "colour": "blue"}, "colour"),
])
def test_generate_refuses_bad_fields_by_name(fake_shared, body, field):
    resp = requests.post(fake_shared.url + "/generate", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert (err["object"], err["code"], err["param"]) == ("error", 400, field)
    assert err["message"].startswith(field + ":")


def test_body_that_is_not_json(fake_shared):
    resp = requests.post(fake_shared.url + "/generate", data="{not json", timeout=30,
                         headers={"content-type": "application/json"})
    assert resp.status_code == 400
    assert resp.json()["param"] == "body"


@pytest.mark.parametrize("body, field", [
    ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "a", "seed": "x"}, "seed"),
    ({"prompt": "a", "echo": "yes"}, "echo"),
    ({"prompt": "a", "logprobs": 65}, "logprobs"),
    ({"prompt": "a", "stream": True}, "stream"),
    ({"prompt": "a", "best_of": 3}, "best_of"),
    ({"prompt": "a", "logprobs": -1}, "logprobs"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "A"]}, "prompt[1]"),
    ({"prompt": [[5, 999]]}, "prompt[0]"),
    ({"prompt": "a", "max_new_tokens": 3}, "max_new_tokens"),  # SGLang's name, not OpenAI's
])
def test_completions_refuse_bad_fields_by_name(fake_shared, body, field):
    resp = requests.post(fake_shared.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["param"] == field
    assert field in resp.json()["message"]


@pytest.mark.parametrize("body, field", [
    ({}, "model_path"),
    ({"model_path": ""}, "model_path"),
    ({"model_path": "fake://salt/1", "weight_version": 3}, "weight_version"),
    ({"model_path": "fake://salt/1", "load_format": "gguf"}, "load_format"),
    ({"model_path": "fake://salt/1", "flush_cache": "yes"}, "flush_cache"),
    ({"model_path": "fake://salt/1", "reload": True}, "reload"),
])
def test_weight_update_refuses_bad_fields_by_name(fake, body, field):
    resp = requests.post(fake.url + "/update_weights_from_disk", json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["param"] == field
    assert fake.engine.control == []  # nothing reached the engine


def test_engine_refusal_is_a_400_with_the_engines_words(fake_shared):
    resp = requests.post(fake_shared.url + "/generate", json={"text": f"a{REFUSED_CHAR}", "sampling_params": ONE})
    assert resp.status_code == 400
    assert "refused" in resp.json()["message"]


def test_engine_crash_is_a_500_naming_the_error(fake_shared):
    resp = requests.post(fake_shared.url + "/generate", json={"text": f"a{CRASH_CHAR}", "sampling_params": ONE})
    assert resp.status_code == 500
    assert resp.json()["message"] == "ValueError: engine crashed"
    ok = requests.post(fake_shared.url + "/generate", json={"text": "a", "sampling_params": ONE})
    assert ok.status_code == 200  # the scheduler survived
