"""The ``openai`` package against ``/v1/completions``: legacy completions shape with log-probs."""

from __future__ import annotations

import openai
import pytest
import requests

from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def client(fake_shared):
    with openai.OpenAI(base_url=fake_shared.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def native(served, prompt, **sampling):
    body = {"text": prompt, "sampling_params": sampling, "return_logprob": True}
    return requests.post(served.url + "/generate", json=body, timeout=30).json()


def test_completion_with_logprobs_matches_native_generate(fake_shared, client):
    # logprobs=0: the sampled tokens' log-probs only (top-k dicts need an engine that reports them, see
    # test_server_sglang_clients.py); SGLang then answers an empty top_logprobs list.
    out = client.completions.create(
        model="tiny", prompt="3+4=", max_tokens=5, logprobs=0, seed=2, temperature=0.7
    )
    assert (out.object, out.model, len(out.choices)) == ("text_completion", "tiny", 1)
    ref = native(fake_shared, "3+4=", max_new_tokens=5, sampling_seed=2, temperature=0.7)
    choice = out.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.text == ref["text"]
    lp = choice.logprobs
    assert lp.token_logprobs == [e[0] for e in ref["meta_info"]["output_token_logprobs"]]
    assert lp.tokens == [TOK.decode([t]) for t in ref["output_ids"]]
    assert lp.text_offset == list(range(5))  # one character per char-tokenizer token
    assert lp.top_logprobs == []
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (4, 5, 9)


def test_without_logprobs_there_are_none(client):
    out = client.completions.create(model="tiny", prompt="a", max_tokens=2)
    assert out.choices[0].logprobs is None


def test_default_max_tokens_is_openais_16(client):
    out = client.completions.create(model="tiny", prompt="a")
    assert out.usage.completion_tokens == 16


def test_n_and_several_prompts_number_choices_prompt_major(fake_shared, client):
    out = client.completions.create(model="tiny", prompt=["x", "yy"], max_tokens=3, n=2, seed=1)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    ref = requests.post(
        fake_shared.url + "/generate",
        json={"text": ["x", "yy"], "sampling_params": {"max_new_tokens": 3, "n": 2, "sampling_seed": 1}},
    ).json()
    assert [c.text for c in out.choices] == [r["text"] for r in ref]
    assert out.usage.prompt_tokens == 3  # each prompt counted once, as SGLang counts


def test_stop_and_sglang_extras_through_extra_body(client):
    space = TOK.encode(" ")[0]
    out = client.completions.create(model="tiny", prompt="q", max_tokens=10, stop=[";"])
    assert (out.choices[0].text, out.choices[0].finish_reason) == ("b", "stop")
    assert out.choices[0].model_extra["matched_stop"] == ";"
    out = client.completions.create(
        model="tiny",
        prompt="q",
        max_tokens=10,
        extra_body={"stop_token_ids": [space], "top_k": 5, "return_token_ids": True},
    )
    choice = out.choices[0]
    assert choice.model_extra["matched_stop"] == space
    assert choice.model_extra["token_ids"][-1] == space


def test_token_id_prompt(client):
    out = client.completions.create(model="tiny", prompt=TOK.encode("ab"), max_tokens=2)
    assert out.usage.prompt_tokens == 2


def test_bad_field_is_an_openai_bad_request_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="a", max_tokens=2, extra_body={"temprature": 1.0})
    assert "temprature" in str(err.value)
