"""``ServerLimits`` at their boundaries: the limit is served, one past it refused (413 for the body, 400
naming the field otherwise), and the server keeps serving after every refusal."""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests
from server_kit import FakeEngine, same_samples

from ringzero.cli.main import main
from ringzero.errors import RingzeroError
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.server.schema import ServerLimits
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

LIMITS = ServerLimits(max_body_bytes=2048, max_request_sequences=8, max_request_tokens=40, max_new_tokens=16)
PLAIN = {"text": "ab", "sampling_params": {"max_new_tokens": 3}}


@pytest.fixture(scope="module")
def url():
    server = RolloutServer(FakeEngine(), CharTokenizer(), model_path="fake://salt/0", limits=LIMITS)
    with ServerThread(server.app) as thread:
        yield thread.url


def serves(url: str) -> None:
    resp = requests.post(url + "/generate", json=PLAIN, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["output_ids"] and resp.json()["meta_info"]["prompt_tokens"] == 2


def refused(resp: requests.Response, status: int, field: str) -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert (err["code"], err["param"]) == (status, field), err
    assert err["message"].startswith(field + ":")
    return err["message"]


def padded(size: int) -> bytes:
    """A valid /generate body of exactly ``size`` bytes (JSON allows trailing whitespace)."""
    raw = json.dumps(PLAIN).encode()
    return raw + b" " * (size - len(raw))


# --- body bytes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/generate", "/v1/completions", "/update_weights_from_disk", "/abort_request"]
)
def test_a_body_over_the_limit_is_refused_with_413(url, path):
    resp = requests.post(url + path, data=padded(LIMITS.max_body_bytes + 1), timeout=30)
    assert "max_body_bytes" in refused(resp, 413, "body")
    serves(url)


def test_a_body_at_the_limit_is_served(url):
    resp = requests.post(url + "/generate", data=padded(LIMITS.max_body_bytes), timeout=30)
    assert resp.status_code == 200, resp.text


def test_a_chunked_body_is_capped_while_it_is_read(url):
    def chunks(size):  # a generator body goes out chunked, with no Content-Length
        raw = padded(size)
        for i in range(0, len(raw), 100):
            yield raw[i : i + 100]

    ok = requests.post(url + "/generate", data=chunks(LIMITS.max_body_bytes), timeout=30)
    assert ok.status_code == 200, ok.text
    assert "Content-Length" not in ok.request.headers
    refused(requests.post(url + "/generate", data=chunks(LIMITS.max_body_bytes + 1), timeout=30), 413, "body")
    serves(url)


def test_a_declared_length_over_the_limit_is_refused_before_the_body_arrives(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        # Declares 10 GiB and sends none of it: the answer must come from the header alone.
        sock.sendall(
            b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10737418240\r\n\r\n"
        )
        start, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer:
            piece = sock.recv(4096)
            if not piece:
                break
            answer += piece
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert time.monotonic() - start < 5
    serves(url)


# --- batch limits ------------------------------------------------------------------------------------


def generate(url: str, **body) -> requests.Response:
    return requests.post(url + "/generate", json=body, timeout=30)


def test_sequences_per_request_at_and_over_the_limit(url):
    limit = LIMITS.max_request_sequences
    one = {"max_new_tokens": 1}  # 3 tokens a sequence: well inside the token limit
    assert generate(url, input_ids=[[5]] * limit, sampling_params=one).status_code == 200
    msg = refused(generate(url, input_ids=[[5]] * (limit + 1), sampling_params=one), 400, "input_ids")
    assert "max_request_sequences" in msg
    assert generate(url, text=["a", "b"], sampling_params={**one, "n": limit // 2}).status_code == 200
    refused(
        generate(url, text=["a", "b"], sampling_params={**one, "n": limit // 2 + 1}), 400, "sampling_params.n"
    )
    serves(url)


def test_tokens_per_request_at_and_over_the_limit(url):
    # "ab" + 8 new tokens = 10 tokens a sequence; the limit is 40.
    assert generate(url, text="ab", sampling_params={"max_new_tokens": 8, "n": 4}).status_code == 200
    msg = refused(
        generate(url, text=["ab", "ab", "ab", "abc"], sampling_params={"max_new_tokens": 8}), 400, "text"
    )
    assert "41 tokens" in msg and "max_request_tokens" in msg
    serves(url)


def test_max_new_tokens_at_and_over_the_limit(url):
    limit = LIMITS.max_new_tokens
    assert generate(url, text="a", sampling_params={"max_new_tokens": limit}).status_code == 200
    refused(
        generate(url, text="a", sampling_params={"max_new_tokens": limit + 1}),
        400,
        "sampling_params.max_new_tokens",
    )
    refused(
        generate(
            url, text=["a", "b"], sampling_params=[{"max_new_tokens": 1}, {"max_new_tokens": limit + 1}]
        ),
        400,
        "sampling_params[1].max_new_tokens",
    )
    # The default (128) counts too: this server's limit is below it.
    refused(generate(url, text="a"), 400, "sampling_params.max_new_tokens")
    ok = requests.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": limit}, timeout=30)
    assert ok.status_code == 200, ok.text
    refused(
        requests.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": limit + 1}, timeout=30),
        400,
        "max_tokens",
    )
    refused(
        requests.post(url + "/v1/completions", json={"prompt": ["a"] * 9, "max_tokens": 1}, timeout=30),
        400,
        "prompt",
    )
    serves(url)


# --- the settings themselves -------------------------------------------------------------------------


def test_defaults_are_generous():
    limits = ServerLimits()
    assert limits.max_body_bytes == 64 * 1024 * 1024
    assert limits.max_request_sequences >= 4096 and limits.max_new_tokens >= 1 << 17


@pytest.mark.parametrize(
    "name", ["max_body_bytes", "max_request_sequences", "max_request_tokens", "max_new_tokens"]
)
@pytest.mark.parametrize("value", [0, -1, True, 1.5, "8"])
def test_a_bad_limit_is_refused_by_name(name, value):
    with pytest.raises(RingzeroError, match=f"server limit {name}: must be an integer >= 1"):
        ServerLimits(**{name: value})


def test_serve_refuses_a_bad_limit_flag_with_exit_2(capsys):
    assert main(["serve", "--checkpoint", "file:///nonexistent/ckpt", "--max-request-tokens", "0"]) == 2
    assert "max_request_tokens" in capsys.readouterr().err


def test_the_http_client_splits_a_large_batch_under_the_servers_limit(url, monkeypatch):
    """A stage's batch larger than one request may hold goes out as several POSTs, each within the limit
    (here 2 prompts x n = 2 per POST against a server that takes at most LIMITS.max_request_sequences)."""
    from ringzero.rollout.clients import http_client
    from ringzero.rollout.clients.http_client import HttpRolloutClient
    from ringzero.rollout.types import GenerateRequest, SamplingParams

    tok = CharTokenizer()
    reqs = [
        GenerateRequest(tok.encode(f"q{i}"), SamplingParams(max_new_tokens=2, n=2, seed=i)) for i in range(7)
    ]
    client = HttpRolloutClient(url, retries=0)
    monkeypatch.setattr(http_client, "MAX_SEQUENCES_PER_POST", 10**6)
    with pytest.raises(RingzeroError, match="400"):
        client.generate(reqs)  # all 14 sequences in one request: over the server's limit
    monkeypatch.setattr(http_client, "MAX_SEQUENCES_PER_POST", LIMITS.max_request_sequences)
    got = client.generate(reqs)
    assert [len(g) for g in got] == [2] * 7
    for got_group, want_group in zip(got, FakeEngine().generate(reqs), strict=True):
        assert all(same_samples(a, b) for a, b in zip(got_group, want_group, strict=True))
