"""Text bodies through every tokenizer path ``ringzero serve`` takes: a ``--model-path`` folder from
``ringzero export`` (its ``tokenizer.json``, the char tokenizer as a real ``tokenizers`` model), ``--init
random`` and a ``--checkpoint`` in the store (the char tokenizer). Each server is built as the command builds
it (``serve_cmd.build_server``) on a tiny model.

SGLang's own test prompts (capitals and punctuation as its tests write them) get a 200 or a 400 naming the
characters the tokenizer has no token for and their positions, the same on every path and every endpoint
that takes text; a fuzz of text bodies finds no 5xx, and the server serves on."""

from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_kit import TINY, assert_clean, tiny_model

from ringzero.cli.main import build_parser
from ringzero.cli.serve_cmd import build_server
from ringzero.model.checkpoint import save_model
from ringzero.rollout.server.app import ServerThread
from ringzero.store import open_store
from ringzero.tokenizer.char import DEFAULT_ALPHABET

pytestmark = pytest.mark.xdist_group("rollout_server")

PATHS = ["model-path", "init-random", "checkpoint"]
MAX_BATCH = 4
TIMEOUT_S = 30
PLAIN = {"text": "ab;cd", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}

# SGLang's test prompts as written there (sgl-project/sglang, python/sglang/test/):
SGLANG_PROMPTS = [
    "The capital of France is",  # kits/abort_timeout_kit.py, ascend/test_npu_logging.py, ...
    "The capital of the United Kingdom is",  # runners.py DEFAULT_PROMPTS
    "Today is a sunny day and I like",
    "AI is a field of computer science focused on",
    "Apple is red. Banana is Yellow. " * 800 + "Apple is",
    "Human: What is the capital of France and how is that city like. Give me 3 trivial information about "
    "that city. Write in a format of json.\nAssistant:",  # send_one.py --json
]
ENCODABLE = "today is a sunny day and i like"  # the same words in the char tokenizer's alphabet


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``{path: (url, info)}``: one server per tokenizer path, built from ``ringzero serve``'s arguments."""
    tmp = tmp_path_factory.mktemp("text")
    config = tmp / "model.yaml"
    # layer_group_size 2: Lightning then MLA, TINY's layout, as the Ling 2.5 reference builds it (exportable)
    config.write_text(json.dumps({"model": {**TINY, "layer_group_size": 2}}))  # JSON is YAML
    folder = tmp / "exported"
    export = build_parser().parse_args(["export", "--init", "random", "--config", str(config), str(folder)])
    assert export.handler(export) == 0
    uri = save_model(open_store(f"file://{tmp}/store"), "base", tiny_model(0))
    sources = {
        "model-path": ["--model-path", str(folder)],
        "init-random": ["--init", "random", "--config", str(config)],
        "checkpoint": ["--checkpoint", uri],
    }
    threads = {}
    for name, source in sources.items():
        args = build_parser().parse_args(
            ["serve", *source, "--precision", "fp32", "--max-batch", str(MAX_BATCH)]
        )
        threads[name] = ServerThread(build_server(args).app)
        threads[name].start()
    assert (
        "tokenizer.json"
        in requests.get(threads["model-path"].url + "/get_model_info").json()["tokenizer_path"]
    )
    yield {name: t.url for name, t in threads.items()}
    for t in threads.values():
        t.stop()


def unencodable(text: str) -> list[str]:
    """How a refusal names the characters the char alphabet lacks (the first eight of them)."""
    return [f"{ch!r} at position {i}" for i, ch in enumerate(text) if ch not in DEFAULT_ALPHABET][:8]


def post_text(url: str, endpoint: str, text, max_new: int = 4) -> requests.Response:
    if endpoint == "/generate":
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0}}
    else:
        body = {"prompt": text, "max_tokens": max_new, "temperature": 0}
    return requests.post(url + endpoint, json=body, timeout=TIMEOUT_S)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("endpoint", ["/generate", "/v1/completions"])
def test_sglang_prompts_get_a_200_or_a_400_naming_the_characters(served, path, endpoint):
    field = "text" if endpoint == "/generate" else "prompt"
    for prompt in SGLANG_PROMPTS:
        resp = post_text(served[path], endpoint, prompt)
        assert resp.status_code == 400, resp.text[:500]
        err = resp.json()
        assert err["param"] == field and err["error"]["message"] == err["message"], err
        named = err["message"].removeprefix(f"{field}: ")
        assert named.startswith(", ".join(unencodable(prompt)[:-1])), (prompt[:40], err["message"][:300])
        assert unencodable(prompt)[-1] in named
    # the same words in the alphabet are served, alone and in a batch with a refused one named by index
    assert post_text(served[path], endpoint, ENCODABLE, max_new=2).status_code == 200
    batch = post_text(served[path], endpoint, [ENCODABLE, "The capital of France is"])
    assert batch.status_code == 400 and batch.json()["param"] == f"{field}[1]"


@pytest.mark.parametrize("path", PATHS)
def test_the_capital_of_france_is_refused_alike_on_every_path(served, path):
    resp = post_text(served[path], "/generate", "The capital of France is")
    message = resp.json()["message"]
    assert message.startswith("text: 'T' at position 0 and 'F' at position 15 are not in the "), message
    assert message.endswith("has no unknown token" if path == "model-path" else "char tokenizer's alphabet")


@pytest.mark.parametrize("path", PATHS)
def test_server_info_reports_the_engines_capacity_as_integers(served, path):
    info = requests.get(served[path] + "/get_server_info", timeout=TIMEOUT_S).json()
    context = TINY["max_position_embeddings"]
    assert info["max_total_num_tokens"] == MAX_BATCH * context  # rows decoded together x their positions
    assert (info["max_running_requests"], info["context_length"], info["max_req_input_len"]) == (
        MAX_BATCH,
        context,
        context - 1,
    )
    for key in ("max_total_num_tokens", "max_running_requests", "context_length", "max_req_input_len"):
        assert type(info[key]) is int, (key, info[key])
    assert info["model_path"] == requests.get(served[path] + "/get_model_info").json()["model_path"]


# --- the fuzz ----------------------------------------------------------------------------------------

texts = st.one_of(
    st.text(),  # any code point hypothesis draws: astral, combining, private use, control characters
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=20),  # control characters, NUL included
    st.text(alphabet=DEFAULT_ALPHABET, max_size=40),  # encodable: short ones are served
    st.sampled_from(["", "\x00", "a\x00b", " ", "\u27e8eos\u27e9", "ab\u27e8pad\u27e9", *SGLANG_PROMPTS]),
    st.builds(
        lambda piece, n: piece * n,
        st.sampled_from(["a", "A", "\u00e9", "\U0001f600", "\x00"]),
        st.integers(1_000, 200_000),
    ),  # very long
    st.none(),
)
text_fields = st.one_of(texts, st.lists(texts, max_size=3))
# What no hypothesis string holds: JSON escapes of lone surrogates, in a prompt, a batch and a rid.
RAW = [
    b'{"text": "a\\ud800b"}',
    b'{"text": ["ab", "\\udfff"]}',
    b'{"prompt": "\\udc80"}',
    b'{"text": "ab", "rid": "\\ud800"}',
    b'{"\\ud800": 1}',
    b'{"prompt": "a", "model": "m\\udc00"}',
]


@pytest.mark.parametrize("path", PATHS)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    text=text_fields, endpoint=st.sampled_from(["/generate", "/v1/completions"]), max_new=st.integers(0, 3)
)
def test_text_bodies_never_get_a_5xx(served, path, text, endpoint, max_new):
    assert_clean(post_text(served[path], endpoint, text, max_new))


@pytest.mark.parametrize("path", PATHS)
def test_lone_surrogates_are_refused_by_field_and_the_server_serves_on(served, path):
    url = served[path]
    want = requests.post(url + "/generate", json=PLAIN, timeout=TIMEOUT_S).json()
    for raw in RAW:
        endpoint = "/v1/completions" if b"prompt" in raw else "/generate"
        resp = requests.post(url + endpoint, data=raw, timeout=TIMEOUT_S)
        assert resp.status_code == 400, (raw, resp.text)
        assert_clean(resp)
        assert "lone surrogate" in resp.json()["message"]
    assert requests.get(url + "/health", timeout=TIMEOUT_S).status_code == 200
    again = requests.post(url + "/generate", json=PLAIN, timeout=TIMEOUT_S).json()
    assert (again["text"], again["output_ids"]) == (want["text"], want["output_ids"])
