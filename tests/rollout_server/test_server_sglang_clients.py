"""Request bodies the clients of SGLang send, replayed against this server with the real engine.

Each body keeps the shape of its source (cited above it); prompts are shortened and kept in the char
tokenizer's alphabet, and lengths fit the tiny model's 48-token context. Values are checked against
the model itself: prompt and top-k log-probs against a teacher-forced forward, deterministic scoring
bitwise against the generation it rescores.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
import torch
from server_kit import POLICY, tiny_model, wait_until

from ringzero.model.checkpoint import save_model
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.store import open_store
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def post(served, path, body=None, status=200, **kwargs):
    resp = requests.post(served.url + path, json=body, timeout=60, **kwargs)
    assert resp.status_code == status, resp.text
    return resp.json() if resp.content else None


def teacher_forced(ids: list[int], temperature: float = 1.0):
    """``log_softmax(logits / T)`` at each position of ``ids`` from one parallel forward of the served
    weights."""
    with torch.no_grad():
        logits = tiny_model(0)(torch.tensor([ids]))[0].double()
    return torch.log_softmax(logits / temperature, -1)


def assert_prompt_logprobs(item, prompt: list[int], start: int, top_k: int, temperature: float = 1.0):
    """SGLang's prompt convention: positions ``start..L-1``, the first null, then log p(token | prefix)."""
    meta = item["meta_info"]
    entries = meta["input_token_logprobs"]
    assert [e[1] for e in entries] == prompt[start:]
    assert entries[0][0] is None
    logp = teacher_forced(prompt, temperature)
    for j, (value, token, _) in enumerate(entries[1:], start=start + 1):
        assert value == pytest.approx(logp[j - 1, token].item(), abs=1e-5)
    if top_k:
        tops = meta["input_top_logprobs"]
        assert len(tops) == len(entries) and tops[0] is None
        for j, top in enumerate(tops[1:], start=start + 1):
            want = logp[j - 1].topk(top_k)
            assert [t[1] for t in top] == want.indices.tolist()
            assert [t[0] for t in top] == pytest.approx(want.values.tolist(), abs=1e-5)


# --- SGLang's own HTTP tests -------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["real", "real_deterministic"])
def test_run_decode_body_with_prompt_and_top_logprobs(request, fixture):
    # sgl-project/sglang test/srt/test_srt_endpoint.py, TestSRTEndpoint.run_decode(return_logprob=True,
    # top_logprobs_num=5, return_text=True)
    served = request.getfixturevalue(fixture)
    prompt = "the capital of france is"
    item = post(
        served,
        "/generate",
        {
            "text": prompt,
            "sampling_params": {"temperature": 0, "max_new_tokens": 16, "n": 1},
            "stream": False,
            "return_logprob": True,
            "top_logprobs_num": 5,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        },
    )
    meta = item["meta_info"]
    assert meta["prompt_tokens"] == len(meta["input_token_logprobs"]) == len(prompt)
    assert "".join(e[2] for e in meta["input_token_logprobs"]) == prompt
    assert_prompt_logprobs(item, TOK.encode(prompt), 0, 5)
    outputs, tops = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(tops) == len(outputs) == meta["completion_tokens"]
    logp = teacher_forced(TOK.encode(prompt) + item["output_ids"])
    for i, (entry, top) in enumerate(zip(outputs, tops, strict=True)):
        assert len(top) == 5 and [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
        assert top[0] == entry  # greedy: the sampled token is the most likely one, value for value
        assert [t[2] for t in top] == [TOK.decode([t[1]], skip_special=False) for t in top]
        want = logp[len(prompt) - 1 + i].topk(5)
        assert [t[1] for t in top] == want.indices.tolist()


def test_logprob_start_len_zero_without_return_logprob_is_accepted_and_ignored(real):
    # sgl-project/sglang test/srt/test_srt_endpoint.py, TestSRTEndpoint.run_decode() (test_simple_decode)
    item = post(
        real,
        "/generate",
        {
            "text": "the capital of france is",
            "sampling_params": {"temperature": 0, "max_new_tokens": 16, "n": 1},
            "stream": False,
            "return_logprob": False,
            "top_logprobs_num": 0,
            "return_text_in_logprobs": False,
            "logprob_start_len": 0,
        },
    )
    assert not any(key.endswith("logprobs") for key in item["meta_info"])


def test_logprob_start_len_body(real):
    # sgl-project/sglang test/srt/test_srt_endpoint.py, TestSRTEndpoint.test_logprob_start_len
    logprob_start_len, new_tokens = 4, 4
    prompts = ["i have a very good idea on", "today is a sunndy day and"]
    out = post(
        real,
        "/generate",
        {
            "text": prompts,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True},
            "return_logprob": True,
            "top_logprobs_num": 5,
            "return_text_in_logprobs": True,
            "logprob_start_len": logprob_start_len,
        },
    )
    for prompt, res in zip(prompts, out, strict=True):
        meta = res["meta_info"]
        assert meta["prompt_tokens"] == logprob_start_len + len(meta["input_token_logprobs"])
        assert prompt.endswith("".join(x[-1] for x in meta["input_token_logprobs"]))
        assert meta["completion_tokens"] == len(meta["output_token_logprobs"]) == new_tokens
        assert_prompt_logprobs(res, TOK.encode(prompt), logprob_start_len, 5)


def test_default_start_len_reports_only_the_last_prompt_position(real):
    # sgl-project/sglang test/srt/test_srt_endpoint.py, TestSRTEndpoint.test_logprob_with_chunked_prefill
    # (prompt shortened): logprob_start_len -1 gives the one null entry of the last prompt position.
    res = post(
        real,
        "/generate",
        {
            "text": "i have a very good idea on this. ",
            "sampling_params": {"temperature": 0, "max_new_tokens": 4},
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": 5,
        },
    )
    meta = res["meta_info"]
    assert meta["input_token_logprobs"] == [[None, TOK.encode(" ")[0], None]]
    assert meta["input_top_logprobs"] == [None]
    assert len(meta["output_top_logprobs"]) == len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    for entry, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"], strict=True):
        assert top[0] == entry and len(top) == 5


@pytest.mark.parametrize("fixture", ["real", "real_deterministic"])
def test_logprob_match_scores_a_generation_with_max_new_tokens_zero(request, fixture):
    # sgl-project/sglang test/srt/test_srt_endpoint.py, TestSRTEndpoint.test_logprob_match: generate,
    # then score prompt + output with max_new_tokens 0 (as verl recomputes log-probs).
    served = request.getfixturevalue(fixture)

    def run_generate(prompt, return_logprob=False, max_new_tokens=512, logprob_start_len=-1):
        prompt_kwargs = {"text": prompt} if isinstance(prompt, str) else {"input_ids": prompt}
        return post(
            served,
            "/generate",
            {
                **prompt_kwargs,
                "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
                "return_logprob": return_logprob,
                "return_text_in_logprobs": True,
                "logprob_start_len": logprob_start_len,
            },
        )

    gen = run_generate(
        "i have a very good idea on how to", return_logprob=True, max_new_tokens=12, logprob_start_len=0
    )
    meta = gen["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 12}  # ignore_eos: only the cap ends it
    output_logprobs = [x[0] for x in meta["output_token_logprobs"]]
    input_tokens = [x[1] for x in meta["input_token_logprobs"]]
    output_tokens = [x[1] for x in meta["output_token_logprobs"]]
    score = run_generate(
        input_tokens + output_tokens, return_logprob=True, logprob_start_len=0, max_new_tokens=0
    )
    assert score["output_ids"] == [] and score["text"] == ""
    assert score["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert score["meta_info"]["output_token_logprobs"] == []
    scored = [x[0] for x in score["meta_info"]["input_token_logprobs"][meta["prompt_tokens"] :]]
    if fixture == "real_deterministic":
        assert scored == output_logprobs  # the one scoring path: bitwise
    else:
        assert scored == pytest.approx(output_logprobs, abs=1e-4)


def test_temp_scaled_prompt_logprobs(real):
    # sgl-project/sglang test/srt/test_eagle_infer.py, TestEAGLEServer.test_logprob_match sends
    # temp_scaled_logprobs; here it scales the prompt log-probs by the request's temperature.
    prompt = TOK.encode("abc=12")
    res = post(
        real,
        "/generate",
        {
            "input_ids": prompt,
            "sampling_params": {"temperature": 0.5, "max_new_tokens": 0, "ignore_eos": True},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
            "temp_scaled_logprobs": True,
            "top_logprobs_num": 3,
        },
    )
    assert_prompt_logprobs(res, prompt, 0, 3, temperature=0.5)


def test_max_new_tokens_zero_prompt_may_fill_the_context(real):
    prompt = [5 + i % 50 for i in range(48)]  # the tiny model's whole context
    res = post(
        real,
        "/generate",
        {
            "input_ids": prompt,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 40,
        },
    )
    assert_prompt_logprobs(res, prompt, 40, 0)
    resp = requests.post(
        real.url + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}
    )
    assert resp.status_code == 400  # one to continue must leave room


def test_ignore_eos_ignores_stop_ids_but_not_stop_strings(real):
    every_id = list(range(TOK.vocab_size))
    base = {
        "text": "7*8=",
        "sampling_params": {"max_new_tokens": 10, "sampling_seed": 4, "stop_token_ids": every_id},
    }
    stopped = post(real, "/generate", base)
    assert stopped["meta_info"]["finish_reason"]["type"] == "stop" and len(stopped["output_ids"]) == 1
    base["sampling_params"]["ignore_eos"] = True
    free = post(real, "/generate", base)
    assert free["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert free["output_ids"][0] == stopped["output_ids"][0]  # same seed, same draws
    # SGLang still applies stop strings under ignore_eos.
    target = TOK.decode([free["output_ids"][3]], skip_special=False)
    if len(target) == 1:  # a special token has no single-character text to stop on
        base["sampling_params"]["stop"] = [target]
        cut = post(real, "/generate", base)
        assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
        assert len(cut["output_ids"]) <= 4


# --- slime -------------------------------------------------------------------------------------------


def test_slime_generate_body(real):
    # THUDM/slime slime/rollout/sglang_rollout.py, GenerateState.sampling_params and generate():
    # custom_params whenever rollout_top_p != 1, stop/stop_token_ids None when unset.
    sampling_params = dict(
        temperature=1.0,
        top_p=0.9,
        top_k=-1,
        max_new_tokens=8,
        stop=None,
        stop_token_ids=None,
        skip_special_tokens=True,
        no_stop_trim=True,
        spaces_between_special_tokens=False,
    )
    sampling_params["custom_params"] = {"return_top_p_token_ids": True}
    sampling_params["sampling_seed"] = 7  # GenerateState with sglang_enable_deterministic_inference
    output = post(
        real,
        "/generate",
        {"sampling_params": sampling_params, "return_logprob": True, "input_ids": TOK.encode("12+34=")},
    )
    tokens = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
    assert tokens == output["output_ids"] and output["text"] is not None


def test_slime_pause_abort_continue_and_server_info(real):
    # THUDM/slime slime/backends/sglang_utils/sglang_engine.py: pause_generation / continue_generation
    # post json={}; server_control.py _abort_server_once posts {"abort_all": True}; _init_external reads
    # /get_server_info and compares server args.
    assert post(real, "/pause_generation", {}) == {
        "message": "Generation paused successfully.",
        "status": "ok",
    }
    assert post(real, "/abort_request", {"abort_all": True}) is None
    info = requests.get(real.url + "/get_server_info", timeout=30).json()
    assert info["internal_states"][0]["engine_paused"] is True
    assert post(real, "/continue_generation", {}) == {
        "message": "Generation continued successfully.",
        "status": "ok",
    }
    assert (info["model_path"], info["tp_size"], info["dp_size"], info["pp_size"]) == (
        "random://seed-0",
        1,
        1,
        1,
    )
    assert (info["dtype"], info["enable_fp32_lm_head"], info["enable_deterministic_inference"]) == (
        "float32",
        True,
        False,
    )
    assert (info["random_seed"], info["context_length"], info["weight_version"]) == (0, 48, "0")
    assert set(info["internal_states"][0]) == {
        "last_gen_throughput",
        "engine_paused",
        "waiting_queue_size",
        "running_batch_size",
    }
    assert isinstance(info["version"], str)
    assert requests.get(real.url + "/server_info", timeout=30).json()["model_path"] == "random://seed-0"
    after = requests.get(real.url + "/get_server_info", timeout=30).json()
    assert after["internal_states"][0]["engine_paused"] is False


# --- verl --------------------------------------------------------------------------------------------


def test_verl_scoring_body_with_null_images(real):
    # volcengine/verl verl/workers/rollout/sglang_rollout/http_server_engine.py, HttpServerAdapter.generate
    # (payload with None values dropped) and async_sglang_server.py (max_new_tokens clamped to >= 0,
    # image_data None on text prompts), batched with one null image per prompt.
    prompts = [TOK.encode("3+5=8"), TOK.encode("9-4=5")]
    payload = {
        "rid": "verl-0",
        "sampling_params": {"max_new_tokens": 0, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "n": 1},
        "input_ids": prompts,
        "image_data": [None, None],
        "return_logprob": True,
        "logprob_start_len": 0,
        "lora_path": None,
        "custom_logit_processor": None,
    }
    out = post(real, "/generate", payload)
    assert [o["meta_info"]["id"] for o in out] == ["verl-0_0", "verl-0_1"]
    for prompt, res in zip(prompts, out, strict=True):
        assert res["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert_prompt_logprobs(res, prompt, 0, 0)
    single = post(
        real, "/generate", {**payload, "input_ids": prompts[0], "image_data": None, "rid": "verl-1"}
    )
    assert single["meta_info"]["id"] == "verl-1"
    # HttpServerAdapter.abort_request sends rid "" with abort_all False: nothing to abort.
    assert post(real, "/abort_request", {"rid": "", "abort_all": False}) is None


# --- AReaL -------------------------------------------------------------------------------------------


def test_areal_generate_pause_continue_bodies(real):
    # inclusionAI/AReaL areal/engine/sglang_remote.py, RemoteSGLangEngine.agenerate payload, and
    # update_weights: POST /pause_generation and /continue_generation without a body.
    sample_params = {
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 6,
        "temperature": 1.0,
        "stop_token_ids": [TOK.eos_id],
        "frequency_penalty": 0.0,
    }
    payload = {
        "input_ids": TOK.encode("2*3="),
        "image_data": None,
        "sampling_params": sample_params,
        "return_logprob": True,
        "stream": False,
    }
    assert requests.post(real.url + "/pause_generation", timeout=30).json()["status"] == "ok"
    assert requests.post(real.url + "/continue_generation", timeout=30).json()["status"] == "ok"
    result = post(real, "/generate", payload)
    assert result["meta_info"]["finish_reason"]["type"] in ("stop", "length")
    assert len(result["meta_info"]["output_token_logprobs"]) == len(result["output_ids"])


# --- what a router adds ------------------------------------------------------------------------------


def test_router_fields_at_their_neutral_values(real):
    # sgl-project/sglang python/sglang/srt/managers/io_struct.py GenerateReqInput: fields a router or
    # gateway fills in (dp routing, PD bootstrap, adapters) at the values that leave a request alone.
    out = post(
        real,
        "/generate",
        {
            "text": "1+1=",
            "sampling_params": {"max_new_tokens": 2},
            "rid": "r-1",
            "stream": False,
            "data_parallel_rank": 0,
            "routed_dp_rank": None,
            "bootstrap_host": None,
            "bootstrap_port": None,
            "bootstrap_room": None,
            "lora_path": None,
            "session_id": "s-1",
            "routing_key": "k",
        },
    )
    assert out["meta_info"]["id"] == "r-1"


# --- OpenAI completions with real top-k ----------------------------------------------------------------


def test_openai_completions_top_logprobs_and_echo(real):
    # The openai package's legacy completions call, as SGLang's test/srt/openai_server tests make it.
    prompt = "12+34="
    with openai.OpenAI(base_url=real.url + "/v1", api_key="unused", max_retries=0) as client:
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, logprobs=5, temperature=0)
        lp = out.choices[0].logprobs
        assert len(lp.top_logprobs) == len(lp.tokens) == 5
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert len(top) == 5 and max(top.values()) == value and top[token] == value  # greedy: top-1
        echoed = client.completions.create(
            model="tiny", prompt=prompt, max_tokens=3, logprobs=2, echo=True, temperature=0
        )
        choice = echoed.choices[0]
        assert choice.text.startswith(prompt) and choice.text[len(prompt) :] == out.choices[0].text[:3]
        elp = choice.logprobs
        assert elp.tokens[: len(prompt)] == list(prompt) and elp.token_logprobs[0] is None
        assert elp.top_logprobs[0] is None and len(elp.top_logprobs[1]) == 2
        assert elp.token_logprobs[len(prompt) :] == lp.token_logprobs[:3]
        assert elp.text_offset == list(range(len(prompt) + 3))
        scored = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, logprobs=0, echo=True)
        assert scored.choices[0].text == prompt and scored.usage.completion_tokens == 0
        logp = teacher_forced(TOK.encode(prompt))
        want = [logp[j - 1, t].item() for j, t in enumerate(TOK.encode(prompt)) if j]
        assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(want, abs=1e-5)


# --- abort and pause mid-batch -------------------------------------------------------------------------


class GatedEngine(EmbeddedEngine):
    """The embedded engine, holding its first decoding step until ``gate`` opens.

    An abort or pause sent meanwhile lands while the batch runs, whatever the timing: the held step's
    abort poll returns only after the gate opens.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0
        self.gate, self.entered = threading.Event(), threading.Event()

    def generate(self, requests_, *, abort=None):
        self.calls += 1
        polls = [0]

        def check():
            polls[0] += 1
            if polls[0] == 2:  # the first poll is before the prefill, the second at decoding step 0
                self.entered.set()
                if not self.gate.wait(60):
                    raise RuntimeError("test gate never opened")
            return abort() if abort is not None else frozenset()

        return super().generate(requests_, abort=check)


@pytest.fixture
def gated():
    engine = GatedEngine(tiny_model(0), TOK, POLICY, max_batch=16)
    # Static batches: the gate holds ``generate``; continuous batches have their own tests
    # (test_server_continuous.py).
    server = RolloutServer(engine, TOK, model_path="random://seed-0", batching="static")
    with ServerThread(server.app) as thread:
        server.url = thread.url
        yield server
        engine.gate.set()


def held(server, pool, body):
    """Start ``body`` and wait until the engine holds it at decoding step 0."""
    future = pool.submit(requests.post, server.url + "/generate", json=body, timeout=60)
    wait_until(server.scheduler.engine.entered.is_set, "the batch reached its first decoding step")
    return future


BODY = {
    "text": ["ab", "cd"],
    "rid": "pair",
    "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
    "return_logprob": True,
}


def test_abort_by_rid_stops_that_request_mid_decode(gated):
    with ThreadPoolExecutor(4) as pool:
        running = held(gated, pool, BODY)
        # The rid of each prompt of a batch, as SGLang numbers them.
        assert post(gated, "/abort_request", {"rid": "pair_1"}) is None
        gated.scheduler.engine.gate.set()
        first, second = running.result().json()
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    reason = second["meta_info"]["finish_reason"]
    assert reason == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    assert len(second["output_ids"]) == len(second["meta_info"]["output_token_logprobs"]) == 1


def test_abort_of_a_queued_request_answers_at_once(gated):
    with ThreadPoolExecutor(4) as pool:
        running = held(gated, pool, BODY)
        queued = pool.submit(
            requests.post,
            gated.url + "/generate",
            timeout=60,
            json={"text": "ef", "rid": "late", "sampling_params": {"max_new_tokens": 4}},
        )
        wait_until(lambda: gated.scheduler.live_requests()[0] == 1, "the second request queued")
        post(gated, "/abort_request", {"rid": "late", "abort_message": "client went away"})
        late = queued.result().json()  # answered while the engine still holds the first batch
        assert not running.done()
        gated.scheduler.engine.gate.set()
        assert running.result().status_code == 200
    assert late["meta_info"]["finish_reason"]["type"] == "abort"
    assert late["meta_info"]["finish_reason"]["message"] == "client went away"
    assert late["output_ids"] == [] and gated.scheduler.engine.calls == 1


def test_pause_abort_drains_then_holds_new_work_until_continue(gated):
    engine = gated.scheduler.engine
    with ThreadPoolExecutor(4) as pool:
        running = held(gated, pool, BODY)
        pause = pool.submit(
            requests.post, gated.url + "/pause_generation", json={"mode": "abort"}, timeout=60
        )
        wait_until(lambda: gated.scheduler.abort_calls > 0, "the pause aborted the running batch")
        assert not pause.done()  # it answers once nothing is left running
        engine.gate.set()
        assert pause.result().json()["status"] == "ok"
        for item in running.result().json():
            assert item["meta_info"]["finish_reason"]["type"] == "abort" and len(item["output_ids"]) == 1
        later = pool.submit(
            requests.post,
            gated.url + "/generate",
            timeout=60,
            json={"text": "gh", "sampling_params": {"max_new_tokens": 3}},
        )
        time.sleep(0.2)
        assert not later.done() and engine.calls == 1  # held back while paused
        post(gated, "/continue_generation", {"torch_empty_cache": False})
        assert later.result().json()["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert engine.calls == 2


def test_pause_retract_lets_the_running_batch_finish(gated):
    with ThreadPoolExecutor(4) as pool:
        running = held(gated, pool, BODY)
        assert post(gated, "/pause_generation", {"mode": "retract"})["status"] == "ok"  # answers at once
        gated.scheduler.engine.gate.set()
        assert [i["meta_info"]["finish_reason"]["type"] for i in running.result().json()] == [
            "length",
            "length",
        ]
        post(gated, "/continue_generation")


def test_weight_update_with_abort_all_requests_does_not_wait_for_the_batch(gated, tmp_path):
    uri = save_model(open_store(f"file://{tmp_path}/store"), "step-1", tiny_model(1))
    with ThreadPoolExecutor(4) as pool:
        running = held(gated, pool, BODY)
        update = pool.submit(
            requests.post,
            gated.url + "/update_weights_from_disk",
            timeout=60,
            json={"model_path": uri, "weight_version": "1", "abort_all_requests": True},
        )
        wait_until(lambda: gated.scheduler.abort_calls > 0, "the update aborted the running batch")
        gated.scheduler.engine.gate.set()
        assert update.result().json()["success"] is True
        aborted = running.result().json()
    assert {i["meta_info"]["finish_reason"]["type"] for i in aborted} == {"abort"}
    assert {i["meta_info"]["weight_version"] for i in aborted} == {"0"}
    after = post(gated, "/generate", {"text": "ab", "sampling_params": {"max_new_tokens": 2}})
    assert after["meta_info"]["weight_version"] == "1"


def test_pause_mode_must_be_known(real):
    resp = requests.post(real.url + "/pause_generation", json={"mode": "preserve_kv"}, timeout=30)
    assert resp.status_code == 400 and resp.json()["param"] == "mode"
