"""``HttpRolloutClient``: SGLang bodies out, Completions back, RingzeroErrors that name the endpoint."""

from __future__ import annotations

import socket

import pytest
from server_kit import CRASH_CHAR, REFUSED_CHAR, FakeEngine, same_samples

from ringzero.errors import RingzeroError
from ringzero.rollout.clients.http_client import HttpRolloutClient, sampling_params_body
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_sampling_params_go_out_under_sglangs_names():
    body = sampling_params_body(
        SamplingParams(
            max_new_tokens=9, temperature=0.5, top_p=0.8, stop=("x",), stop_token_ids=(2,), n=4, seed=7
        )
    )
    assert body == {
        "max_new_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.8,
        "top_k": -1,
        "n": 4,
        "stop": ["x"],
        "stop_token_ids": [2],
        "sampling_seed": 7,
    }
    assert sampling_params_body(SamplingParams(top_k=5))["top_k"] == 5


def test_generate_regroups_mixed_n_in_request_order(fake):
    client = HttpRolloutClient(fake.url, retries=0)
    reqs = [
        GenerateRequest(TOK.encode("a"), SamplingParams(max_new_tokens=3, n=2, seed=1), rid="first"),
        GenerateRequest(TOK.encode("bb"), SamplingParams(max_new_tokens=2, seed=2)),
        GenerateRequest(TOK.encode("ccc"), SamplingParams(max_new_tokens=4, n=2, seed=3, stop=(";",))),
    ]
    got = client.generate(reqs)
    assert [len(call) for call in fake.engine.calls] == [2, 1]  # one /generate per distinct n
    want = FakeEngine().generate(reqs)
    for got_group, want_group in zip(got, want, strict=True):
        assert len(got_group) == len(want_group)
        for a, b in zip(got_group, want_group, strict=True):
            assert same_samples(a, b)
    assert got[0][0].meta["prompt_tokens"] == 1


def test_unreachable_server_names_the_endpoint(tmp_path):
    url = closed_port_url()
    client = HttpRolloutClient(url, timeout_s=5, retries=1, backoff_s=0.0)
    with pytest.raises(
        RingzeroError, match=rf"POST {url}/generate: cannot reach the rollout server.*2 attempt"
    ):
        client.generate([GenerateRequest([5])])
    assert client.health() is False


def test_a_400_carries_the_servers_message(fake):
    client = HttpRolloutClient(fake.url, retries=3)
    with pytest.raises(RingzeroError, match=rf"{fake.url}/generate: HTTP 400: .*refused"):
        client.generate([GenerateRequest(TOK.encode(f"a{REFUSED_CHAR}"))])
    assert len(fake.engine.calls) == 1  # a 400 is never retried


def test_a_500_is_retried_then_reported(fake):
    client = HttpRolloutClient(fake.url, retries=2, backoff_s=0.0)
    with pytest.raises(RingzeroError, match=r"HTTP 500: ValueError: engine crashed \(after 3 attempt"):
        client.generate([GenerateRequest(TOK.encode(f"a{CRASH_CHAR}"))])
    assert len(fake.engine.calls) == 3


def test_weight_update_success_and_failure(fake):
    client = HttpRolloutClient(fake.url, retries=0)
    client.update_weights_from_disk("fake://salt/4", "12")
    assert client.model_info()["weight_version"] == "12"
    assert (
        client.generate([GenerateRequest([5], SamplingParams(max_new_tokens=1))])[0][0].weight_version == "12"
    )
    with pytest.raises(
        RingzeroError, match=r"update_weights_from_disk \(fake://gone, version 13\).*no such checkpoint"
    ):
        client.update_weights_from_disk("fake://gone", "13")


def test_health_and_flush(fake):
    client = HttpRolloutClient(fake.url, retries=0)
    assert client.health() is True
    client.flush_cache()
    assert fake.engine.control == ["health", "flush_cache"]


def test_endpoint_must_be_http():
    with pytest.raises(RingzeroError, match="http:// or https://"):
        HttpRolloutClient("127.0.0.1:30000")
