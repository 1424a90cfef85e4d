"""Any body, on any endpoint that reads one, gets a 2xx or a 4xx naming what is wrong: never a 5xx, a hang
or a dead server. One real engine (a tiny random model) serves every example, with small limits so that
a fuzzed batch stays cheap; after each run a plain greedy ``/generate`` still answers as it did before."""

from __future__ import annotations

import json

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_kit import POLICY, assert_clean, tiny_model

from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.server.schema import ServerLimits
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

LIMITS = ServerLimits(
    max_body_bytes=1 << 16, max_request_sequences=8, max_request_tokens=1024, max_new_tokens=64
)
TIMEOUT_S = 30  # a hang is a client timeout, which fails the example
PLAIN = {"text": "ab;cd", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def served():
    engine = EmbeddedEngine(tiny_model(0), CharTokenizer(), POLICY, max_batch=8)
    server = RolloutServer(engine, CharTokenizer(), model_path="random://seed-0", limits=LIMITS)
    with ServerThread(server.app) as thread:
        first = requests.post(thread.url + "/generate", json=PLAIN, timeout=TIMEOUT_S)
        assert first.status_code == 200, first.text
        yield thread.url, first.json()
        assert_still_serving(thread.url, first.json())


def assert_still_serving(url: str, want: dict) -> None:
    assert requests.get(url + "/health", timeout=TIMEOUT_S).status_code == 200
    again = requests.post(url + "/generate", json=PLAIN, timeout=TIMEOUT_S)
    assert again.status_code == 200, again.text
    got = again.json()
    assert (got["text"], got["output_ids"], got["meta_info"]["finish_reason"]) == (
        want["text"],
        want["output_ids"],
        want["meta_info"]["finish_reason"],
    )


# --- strategies ------------------------------------------------------------------------------------

HUGE = st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, 10**300, -(10**300)])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 70),
    st.integers(),
    HUGE,
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 5e-324, 1e300, -0.0]),
    st.text(max_size=8),
    st.text(alphabet="ab;cd ef\n", max_size=12),
)
GENERATE_KEYS = [
    "text",
    "input_ids",
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
    "temp_scaled_logprobs",
    "rid",
    "return_routed_experts",
    "routed_experts_start_len",
    "stream",
    "image_data",
    "lora_path",
    "data_parallel_rank",
    "log_metrics",
    "colour",
]
SAMPLING_KEYS = [
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "n",
    "sampling_seed",
    "no_stop_trim",
    "skip_special_tokens",
    "ignore_eos",
    "min_p",
    "logit_bias",
    "regex",
    "custom_params",
    "stream_interval",
    "bogus",
]
OPENAI_KEYS = [
    "prompt",
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "n",
    "seed",
    "logprobs",
    "echo",
    "best_of",
    "return_token_ids",
    "stream",
    "suffix",
    "user",
    "min_tokens",
    "ignore_eos",
    "colour",
]
UPDATE_KEYS = [
    "model_path",
    "load_format",
    "weight_version",
    "flush_cache",
    "abort_all_requests",
    "torch_empty_cache",
    "is_async",
    "colour",
]
CONTROL_KEYS = ["mode", "rid", "abort_all", "abort_message", "finished_reason", "torch_empty_cache", "colour"]


def values(keys: list[str]):
    """Arbitrary JSON under these keys (and any others), nested a few levels."""
    return st.recursive(
        scalars,
        lambda kids: st.one_of(
            st.lists(kids, max_size=5),
            st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=5)), kids, max_size=5),
        ),
        max_leaves=25,
    )


def plausible(keys: list[str], overrides: dict):
    """Bodies close to valid ones: each known field absent, plausible or arbitrary."""
    anything = values(keys)
    return st.fixed_dictionaries(
        {}, optional={k: st.one_of(overrides.get(k, anything), anything) for k in keys}
    )


token_ids = st.lists(st.integers(0, 63), min_size=1, max_size=8)
sampling = plausible(
    SAMPLING_KEYS,
    {
        "max_new_tokens": st.integers(0, 8),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "top_k": st.integers(-1, 70),
        "n": st.integers(1, 3),
        "stop": st.sampled_from([";", ["d", "\n"]]),
        "stop_token_ids": st.lists(st.integers(0, 63), max_size=3),
        "sampling_seed": st.integers(),
    },
)
generate_bodies = plausible(
    GENERATE_KEYS,
    {
        "text": st.one_of(
            st.text(alphabet="ab;cd ef\n", min_size=1, max_size=10),
            st.lists(st.text(alphabet="abcd", min_size=1, max_size=6), min_size=1, max_size=3),
        ),
        "input_ids": st.one_of(token_ids, st.lists(token_ids, min_size=1, max_size=3)),
        "sampling_params": st.one_of(sampling, st.lists(sampling, min_size=1, max_size=3)),
        "return_logprob": st.booleans(),
        "logprob_start_len": st.integers(-1, 10),
        "top_logprobs_num": st.integers(0, 5),
        "rid": st.text(max_size=4),
    },
)
openai_bodies = plausible(
    OPENAI_KEYS,
    {
        "prompt": st.one_of(
            st.text(alphabet="ab;cd", min_size=1, max_size=8),
            token_ids,
            st.lists(st.text(alphabet="abcd", min_size=1, max_size=4), min_size=1, max_size=3),
        ),
        "max_tokens": st.integers(0, 8),
        "n": st.integers(1, 3),
        "logprobs": st.integers(0, 4),
        "echo": st.booleans(),
        "temperature": st.floats(0, 2),
    },
)
update_bodies = plausible(
    UPDATE_KEYS, {"model_path": st.sampled_from(["/nonexistent/ckpt", "no-such-dir", ""])}
)
control_bodies = plausible(
    CONTROL_KEYS,
    {"mode": st.sampled_from(["abort", "retract", "in_place", "pause"]), "rid": st.text(max_size=4)},
)


def encoded(bodies):
    """What goes on the wire: a body as JSON (NaN and Infinity included), or broken bytes."""
    as_json = bodies.map(lambda b: json.dumps(b, allow_nan=True).encode())
    broken = st.one_of(
        st.binary(max_size=64),
        as_json.flatmap(lambda raw: st.integers(0, max(len(raw) - 1, 0)).map(lambda n: raw[:n])),  # truncated
        st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
        st.integers(1, 5000).map(lambda n: b'{"text":' * n + b'"a"' + b"}" * n),
        st.sampled_from(
            [
                b"",
                b"   ",
                b"null",
                b"\xff\xfe{}",
                b'{"text": "a"',
                b"NaN",
                b'{"text": "\\ud800"}',
                b'{"input_ids": [' + b"9" * 5000 + b"]}",
                b'{"text": "a", "rid": "\\udc00"}',
                b'{"\\ud800": 1}',
                b'{"prompt": "a", "model": "\\ud800"}',
            ]
        ),
    )
    return st.one_of(as_json, as_json, broken)


CONTENT_TYPES = st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", None])


def post(url: str, path: str, raw: bytes, content_type: str | None) -> requests.Response:
    headers = {} if content_type is None else {"Content-Type": content_type}
    return requests.post(url + path, data=raw, headers=headers, timeout=TIMEOUT_S)


# --- the properties --------------------------------------------------------------------------------


@FUZZ
@given(raw=encoded(generate_bodies), content_type=CONTENT_TYPES)
def test_generate_answers_any_body_cleanly(served, raw, content_type):
    assert_clean(post(served[0], "/generate", raw, content_type))


@FUZZ
@given(raw=encoded(openai_bodies), content_type=CONTENT_TYPES)
def test_completions_answer_any_body_cleanly(served, raw, content_type):
    assert_clean(post(served[0], "/v1/completions", raw, content_type))


@settings(FUZZ, max_examples=100)
@given(raw=encoded(update_bodies), content_type=CONTENT_TYPES)
def test_weight_update_answers_any_body_cleanly(served, raw, content_type):
    resp = post(served[0], "/update_weights_from_disk", raw, content_type)
    assert_clean(resp)
    assert resp.status_code != 200  # nothing fuzzed names a loadable checkpoint


@settings(FUZZ, max_examples=60)
@given(
    path=st.sampled_from(["/abort_request", "/pause_generation"]),
    raw=encoded(control_bodies),
    content_type=CONTENT_TYPES,
)
def test_control_endpoints_answer_any_body_cleanly(served, path, raw, content_type):
    try:
        assert_clean(post(served[0], path, raw, content_type))
    finally:
        requests.post(served[0] + "/continue_generation", timeout=TIMEOUT_S)


def test_server_serves_after_the_fuzzing(served):
    assert_still_serving(*served)


# --- a wrong type in a known field is refused by that field's name ---------------------------------

INT_FIELDS = [
    "sampling_params.max_new_tokens",
    "sampling_params.top_k",
    "sampling_params.n",
    "sampling_params.sampling_seed",
    "logprob_start_len",
    "top_logprobs_num",
    "routed_experts_start_len",
]
NUMBER_FIELDS = ["sampling_params.temperature", "sampling_params.top_p"]
BOOL_FIELDS = [
    "sampling_params.ignore_eos",
    "sampling_params.no_stop_trim",
    "return_logprob",
    "return_text_in_logprobs",
    "temp_scaled_logprobs",
]
not_null = values(GENERATE_KEYS).filter(lambda v: v is not None)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and abs(v) != float("inf") and v == v


@st.composite
def wrong_field(draw):
    kind = draw(st.sampled_from(["int", "number", "bool", "text", "input_ids", "stop", "rid", "sampling"]))
    # Fields that may hold one value per prompt take a list, so a list is not a wrong type for them.
    if kind == "int":
        field = draw(st.sampled_from(INT_FIELDS))
        bad = draw(
            not_null.filter(lambda v: not _is_int(v) and not (isinstance(v, list) and "." not in field))
        )
    elif kind == "number":
        field, bad = draw(st.sampled_from(NUMBER_FIELDS)), draw(not_null.filter(lambda v: not _is_number(v)))
    elif kind == "bool":
        field = draw(st.sampled_from(BOOL_FIELDS))
        bad = draw(
            not_null.filter(
                lambda v: not isinstance(v, bool) and not (isinstance(v, list) and field == "return_logprob")
            )
        )
    elif kind == "text":
        field, bad = "text", draw(not_null.filter(lambda v: not isinstance(v, str | list)))
    elif kind == "input_ids":
        field, bad = "input_ids", draw(not_null.filter(lambda v: not isinstance(v, list)))
    elif kind == "stop":
        field, bad = "sampling_params.stop", draw(not_null.filter(lambda v: not isinstance(v, str | list)))
    elif kind == "rid":
        field, bad = "rid", draw(not_null.filter(lambda v: not isinstance(v, str | list)))
    else:
        field, bad = "sampling_params", draw(not_null.filter(lambda v: not isinstance(v, dict | list)))
    return field, bad


@settings(FUZZ, max_examples=120)
@given(case=wrong_field())
def test_a_wrong_type_is_refused_by_its_field_name(served, case):
    field, bad = case
    body = {"text": "ab", "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
    if field == "input_ids":
        del body["text"]
    head, _, leaf = field.partition(".")
    if leaf:
        body[head][leaf] = bad
    else:
        body[head] = bad
    resp = requests.post(served[0] + "/generate", data=json.dumps(body, allow_nan=True), timeout=TIMEOUT_S)
    assert resp.status_code == 400, resp.text
    err = resp.json()
    assert err["param"] is not None and err["param"].startswith(field), (field, bad, err)
    assert err["message"].startswith(err["param"] + ":")
