"""Bad bodies get HTTP 400 with SGLang's error shapes (its ErrorResponse and ``{"error": {"message"}}`` at
once) whose message and ``param`` name the field; an unexpected failure is a 500 naming the exception."""

from __future__ import annotations

import pytest
import requests
from server_kit import CRASH_CHAR, REFUSED_CHAR, FakeEngine

from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

ONE = {"max_new_tokens": 1}


@pytest.mark.parametrize(
    "body, field",
    [
        (
            {"text": "a", "sampling_params": {"max_new_tokens": 1, "temprature": 0.5}},
            "sampling_params.temprature",
        ),
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
        (
            {"text": ["a", "b"], "sampling_params": [ONE, {"max_new_tokens": 1, "bogus": 1}]},
            "sampling_params[1].bogus",
        ),
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
        (
            {"text": "ab", "logprob_start_len": 2, "return_logprob": True},
            "logprob_start_len",
        ),  # past the prompt
        ({"text": ["a", "bc"], "logprob_start_len": [0, 5], "return_logprob": True}, "logprob_start_len[1]"),
        ({"text": "a", "custom_logit_processor": '{"callable": "..."}'}, "custom_logit_processor"),
        ({"text": "a", "sampling_params": {"custom_params": "x"}}, "sampling_params.custom_params"),
        ({"text": "a", "sampling_params": {"ignore_eos": "yes"}}, "sampling_params.ignore_eos"),
        ({"text": "a", "routed_dp_rank": 1}, "routed_dp_rank"),  # one data-parallel rank
        ({"text": "a", "bootstrap_host": "10.0.0.1"}, "bootstrap_host"),  # no prefill/decode disaggregation
        ({"text": "a", "lora_path": "adapter"}, "lora_path"),
        ({"text": "a", "return_logprob": "yes"}, "return_logprob"),
        ({"text": ["a", "b"], "rid": ["same", "same"]}, "rid"),
        ({"text": "a", "colour": "blue"}, "colour"),
    ],
)
def test_generate_refuses_bad_fields_by_name(fake_shared, body, field):
    resp = requests.post(fake_shared.url + "/generate", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert (err["object"], err["code"], err["param"]) == ("error", 400, field)
    assert err["message"].startswith(field + ":")


def test_body_that_is_not_json(fake_shared):
    resp = requests.post(
        fake_shared.url + "/generate",
        data="{not json",
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["param"] == "body"


@pytest.mark.parametrize(
    "body, field",
    [
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
    ],
)
def test_completions_refuse_bad_fields_by_name(fake_shared, body, field):
    resp = requests.post(fake_shared.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["param"] == field
    assert field in resp.json()["message"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "model_path"),
        ({"model_path": ""}, "model_path"),
        ({"model_path": "fake://salt/1", "weight_version": 3}, "weight_version"),
        ({"model_path": "fake://salt/1", "load_format": "gguf"}, "load_format"),
        ({"model_path": "fake://salt/1", "flush_cache": "yes"}, "flush_cache"),
        ({"model_path": "fake://salt/1", "reload": True}, "reload"),
    ],
)
def test_weight_update_refuses_bad_fields_by_name(fake, body, field):
    resp = requests.post(fake.url + "/update_weights_from_disk", json=body, timeout=30)
    assert resp.status_code == 400
    assert resp.json()["param"] == field
    assert fake.engine.control == []  # nothing reached the engine


def test_engine_refusal_is_a_400_with_the_engines_words(fake_shared):
    resp = requests.post(
        fake_shared.url + "/generate", json={"text": f"a{REFUSED_CHAR}", "sampling_params": ONE}
    )
    assert resp.status_code == 400
    assert "refused" in resp.json()["message"]


def test_engine_crash_is_a_500_naming_the_error(fake_shared):
    resp = requests.post(
        fake_shared.url + "/generate", json={"text": f"a{CRASH_CHAR}", "sampling_params": ONE}
    )
    assert resp.status_code == 500
    assert resp.json()["message"] == "ValueError: engine crashed"
    ok = requests.post(fake_shared.url + "/generate", json={"text": "a", "sampling_params": ONE})
    assert ok.status_code == 200  # the scheduler survived


# --- SGLang's error shapes ---------------------------------------------------------------------------

# Recorded from sgl-project/sglang python/sglang/srt/entrypoints/http_server.py: validation_exception_handler
# answers a body GenerateReqInput cannot validate with an ErrorResponse (openai/protocol.py) ...
SGLANG_INVALID = {
    "object": "error",
    "message": "1 validation error for GenerateReqInput ...",
    "type": "Bad Request",
    "param": None,
    "code": 400,
}
# ... generate_request answers a ValueError of the tokenizer manager through _create_error_response (the
# message: tokenizer_manager.py's check of the prompt's length) ...
SGLANG_VALUE_ERROR = {
    "error": {"message": "The input (60 tokens) is longer than the model's context length (48 tokens)."}
}
# ... and openai/serving_base.py create_error_response answers a refused /v1/completions body.
SGLANG_OPENAI_ERROR = {
    "object": "error",
    "message": "...",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}


def shaped_like(answer, recorded, where: str = "body") -> None:
    """Every key of the recorded answer, with a value of the same JSON type (a null may be a string)."""
    assert isinstance(answer, dict), (where, answer)
    for key, want in recorded.items():
        assert key in answer, f"{where}: no {key!r} in {answer}"
        got = answer[key]
        if isinstance(want, dict):
            shaped_like(got, want, f"{where}.{key}")
        elif want is None:
            assert got is None or isinstance(got, str), (where, key, got)
        else:
            assert type(got) is type(want), (where, key, got)


@pytest.mark.parametrize(
    "path, body, status",
    [
        (
            "/generate",
            {"text": "a", "sampling_params": {"temprature": 0.5}},
            400,
        ),  # a field SGLang does not have
        ("/generate", {"text": "The capital of France is"}, 400),  # text the tokenizer cannot encode
        ("/generate", {"text": f"a{REFUSED_CHAR}", "sampling_params": ONE}, 400),  # the engine refused it
        ("/generate", {"text": f"a{CRASH_CHAR}", "sampling_params": ONE}, 500),  # the engine crashed
        ("/generate", "{not json", 400),
        ("/v1/completions", {"prompt": "a", "best_of": 3}, 400),
        ("/v1/completions", {"prompt": ["a", "Paris"]}, 400),
        ("/abort_request", {"rid": 3}, 400),
    ],
)
def test_refusals_carry_every_sglang_error_shape(fake_shared, path, body, status):
    kwargs = {"data": body} if isinstance(body, str) else {"json": body}
    resp = requests.post(fake_shared.url + path, timeout=30, **kwargs)
    assert resp.status_code == status, resp.text
    answer = resp.json()
    for recorded in (SGLANG_INVALID, SGLANG_VALUE_ERROR, SGLANG_OPENAI_ERROR):
        shaped_like(answer, recorded)
    # one message in both places, naming the field when there is one
    assert answer["error"]["message"] == answer["message"] and answer["code"] == status
    if answer["param"] is not None:
        assert answer["message"].startswith(answer["param"] + ": ")


def test_unencodable_text_names_each_character_and_its_position(fake_shared):
    resp = requests.post(fake_shared.url + "/generate", json={"text": ["ab", "The capital of France is"]})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == (
        "text[1]: 'T' at position 0 and 'F' at position 15 are not in the char tokenizer's alphabet"
    )


class BrokenDecoder(CharTokenizer):
    """Decodes nothing: an answer cannot be written, which no handler expects."""

    def decode(self, ids, skip_special=True):
        raise RuntimeError("decoder broke")


def test_an_unexpected_failure_is_a_named_500_and_the_server_serves_on():
    server = RolloutServer(FakeEngine(), BrokenDecoder(), model_path="fake://salt/0")
    with ServerThread(server.app) as thread:
        resp = requests.post(
            thread.url + "/generate", json={"text": "ab", "sampling_params": ONE}, timeout=30
        )
        assert resp.status_code == 500
        assert resp.json()["error"]["message"] == resp.json()["message"] == "RuntimeError: decoder broke"
        assert requests.get(thread.url + "/health", timeout=30).status_code == 200
        ids = requests.post(
            thread.url + "/generate", json={"input_ids": [13], "sampling_params": ONE}, timeout=30
        )
        assert ids.status_code == 500 and ids.json()["code"] == 500  # every answer decodes its text
