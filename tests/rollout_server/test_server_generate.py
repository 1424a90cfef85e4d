"""``POST /generate`` with SGLang-shaped bodies: shapes, batching, n, stops, log-probs."""

from __future__ import annotations

import pytest
import requests
from server_kit import SCRIPT

from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def post(served, body, path="/generate"):
    resp = requests.post(served.url + path, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def engine_direct(served, prompt_ids, **params):
    """What the engine itself returns for one request (the fake is a pure function of its inputs)."""
    return served.engine.generate([GenerateRequest(prompt_ids, SamplingParams(**params))])[0]


def test_single_text_prompt_answers_one_object_in_sglang_shape(fake_shared):
    out = post(fake_shared, {"text": "12+3=", "sampling_params": {"max_new_tokens": 4, "sampling_seed": 1}})
    assert set(out) == {"text", "output_ids", "meta_info"}
    (expected,) = engine_direct(fake_shared, TOK.encode("12+3="), max_new_tokens=4, seed=1)
    assert out["output_ids"] == expected.output_ids
    assert out["text"] == TOK.decode(expected.output_ids)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 4}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (5, 4, "0")
    assert isinstance(meta["id"], str) and meta["id"]
    assert "output_token_logprobs" not in meta  # only with return_logprob


def test_input_ids_and_rid_round_trip(fake_shared):
    ids = TOK.encode("7*8=")
    out = post(fake_shared, {"input_ids": ids, "rid": "req-1", "sampling_params": {"max_new_tokens": 3}})
    assert out["meta_info"]["id"] == "req-1"
    assert out["meta_info"]["prompt_tokens"] == len(ids)


def test_batched_prompts_answer_a_list_in_order_with_per_prompt_params(fake_shared):
    prompts = ["a", "bb", "ccc"]
    out = post(
        fake_shared,
        {
            "text": prompts,
            "sampling_params": [
                {"max_new_tokens": 2},
                {"max_new_tokens": 3},
                {"max_new_tokens": 5, "sampling_seed": 4},
            ],
            "rid": "batch",
        },
    )
    assert isinstance(out, list) and len(out) == 3
    assert [o["meta_info"]["id"] for o in out] == ["batch_0", "batch_1", "batch_2"]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [2, 3, 5]
    (third,) = engine_direct(fake_shared, TOK.encode("ccc"), max_new_tokens=5, seed=4)
    assert out[2]["output_ids"] == third.output_ids


def test_single_prompt_batch_is_still_a_list(fake_shared):
    out = post(fake_shared, {"input_ids": [TOK.encode("x")], "sampling_params": {"max_new_tokens": 2}})
    assert isinstance(out, list) and len(out) == 1


def test_n_expands_prompt_major_like_sglang(fake_shared):
    out = post(
        fake_shared,
        {"text": ["p", "qq"], "sampling_params": {"n": 3, "max_new_tokens": 4, "sampling_seed": 2}},
    )
    assert len(out) == 6
    for i, prompt in enumerate(["p", "qq"]):
        samples = engine_direct(fake_shared, TOK.encode(prompt), n=3, max_new_tokens=4, seed=2)
        assert [o["output_ids"] for o in out[3 * i : 3 * i + 3]] == [s.output_ids for s in samples]
        assert {o["meta_info"]["prompt_tokens"] for o in out[3 * i : 3 * i + 3]} == {len(prompt)}
    assert len({o["meta_info"]["id"] for o in out}) == 6  # each sample its own id, as SGLang


def test_single_prompt_with_n_answers_a_list(fake_shared):
    out = post(fake_shared, {"text": "z", "sampling_params": {"n": 2, "max_new_tokens": 2}})
    assert isinstance(out, list) and len(out) == 2


def test_stop_string_trims_text_but_keeps_tokens(fake_shared):
    # The fake continues "ab;cd ef;gh\n" from offset len(prompt) = 1 with seed 0: "b;cd ef;..."
    out = post(fake_shared, {"text": "q", "sampling_params": {"max_new_tokens": 10, "stop": ";"}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ";"}
    assert TOK.decode(out["output_ids"]) == "b;"
    assert out["text"] == "b"


def test_no_stop_trim_keeps_the_stop_string(fake_shared):
    out = post(
        fake_shared,
        {"text": "q", "sampling_params": {"max_new_tokens": 10, "stop": [";"], "no_stop_trim": True}},
    )
    assert out["text"] == "b;"


def test_stop_token_id_matches_the_id_and_is_trimmed_from_text(fake_shared):
    space = TOK.encode(" ")[0]
    out = post(
        fake_shared, {"text": "q", "sampling_params": {"max_new_tokens": 10, "stop_token_ids": [space]}}
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": space}
    assert out["output_ids"][-1] == space
    assert out["text"] == SCRIPT[1:5]  # "b;cd" without the space


def test_output_token_logprobs_shape_and_values_equal_the_engines(fake_shared):
    out = post(
        fake_shared,
        {"text": "ab", "sampling_params": {"max_new_tokens": 5, "sampling_seed": 3}, "return_logprob": True},
    )
    (expected,) = engine_direct(fake_shared, TOK.encode("ab"), max_new_tokens=5, seed=3)
    entries = out["meta_info"]["output_token_logprobs"]
    assert [e[0] for e in entries] == expected.output_logprobs
    assert [e[1] for e in entries] == out["output_ids"]
    assert [e[2] for e in entries] == [None] * 5  # SGLang: text only with return_text_in_logprobs


def test_return_text_in_logprobs_decodes_each_token(fake_shared):
    out = post(
        fake_shared,
        {
            "text": "ab",
            "sampling_params": {"max_new_tokens": 4},
            "return_logprob": True,
            "return_text_in_logprobs": True,
        },
    )
    entries = out["meta_info"]["output_token_logprobs"]
    assert [e[2] for e in entries] == [TOK.decode([t]) for t in out["output_ids"]]


def test_return_logprob_per_prompt(fake_shared):
    out = post(
        fake_shared,
        {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 2}, "return_logprob": [True, False]},
    )
    assert "output_token_logprobs" in out[0]["meta_info"]
    assert "output_token_logprobs" not in out[1]["meta_info"]


def test_neutral_sglang_fields_are_accepted(fake_shared):
    out = post(
        fake_shared,
        {
            "text": "a",
            "stream": False,
            "log_metrics": False,
            "sampling_params": {
                "max_new_tokens": 2,
                "top_k": -1,
                "min_p": 0.0,
                "frequency_penalty": 0.0,
                "repetition_penalty": 1.0,
                "ignore_eos": False,
                "skip_special_tokens": True,
                "temperature": 0.0,
            },
        },
    )
    assert out["meta_info"]["completion_tokens"] == 2


def test_put_is_accepted_as_in_sglang(fake_shared):
    resp = requests.put(
        fake_shared.url + "/generate", json={"text": "a", "sampling_params": {"max_new_tokens": 1}}
    )
    assert resp.status_code == 200
