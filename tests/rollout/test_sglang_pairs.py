"""Every HTTP body ringzero sends is shaped like SGLang's own, and SGLang's answers parse.

The request shapes are SGLang's request structs (field names and types), the answers are SGLang's
responses, each taken from SGLang's source or docs (cited per pair). A replay server answers each path
with the recorded response and keeps what the client sent, so the client's real bodies are checked,
not ringzero's own server's view of them.
"""

from __future__ import annotations

import json
import threading
import types
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ringzero.errors import RingzeroError
from ringzero.rollout.clients.http_client import HttpRolloutClient
from ringzero.rollout.replicas.replica_set import ReplicaSet
from ringzero.rollout.replicas.weight_group import distributed_update_body, init_group_body
from ringzero.rollout.types import GenerateRequest, SamplingParams

# --- SGLang's request structs: field -> type --------------------------------------------------------

# sgl-project/sglang python/sglang/srt/managers/io_struct.py, GenerateReqInput (the fields ringzero may send).
GENERATE_REQ_INPUT = {
    "rid": str | list[str] | None,
    "text": list[str] | str | None,
    "input_ids": list[list[int]] | list[int] | None,
    "sampling_params": list[dict] | dict | None,
    "return_logprob": list[bool] | bool | None,
    "logprob_start_len": list[int] | int | None,
    "top_logprobs_num": list[int] | int | None,
    "return_text_in_logprobs": bool,
    "stream": bool,
}
# sgl-project/sglang python/sglang/srt/sampling/sampling_params.py, SamplingParams ("API parameters").
SAMPLING_PARAMS = {
    "max_new_tokens": int | None,
    "stop": str | list[str] | None,
    "stop_token_ids": list[int] | None,
    "stop_regex": str | list[str] | None,
    "temperature": float,
    "top_p": float,
    "top_k": int,
    "min_p": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    "repetition_penalty": float,
    "min_new_tokens": int,
    "n": int,
    "json_schema": str | None,
    "regex": str | None,
    "ebnf": str | None,
    "structural_tag": str | None,
    "ignore_eos": bool,
    "skip_special_tokens": bool,
    "spaces_between_special_tokens": bool,
    "no_stop_trim": bool,
    "custom_params": dict | None,
    "stream_interval": int | None,
    "logit_bias": dict | None,
    "sampling_seed": int | None,
}
# io_struct.py, UpdateWeightFromDiskReqInput (plus BaseReq's rid).
UPDATE_WEIGHT_FROM_DISK = {
    "rid": str | None,
    "model_path": str,
    "load_format": str | None,
    "abort_all_requests": bool,
    "weight_version": str | None,
    "is_async": bool,
    "torch_empty_cache": bool,
    "keep_pause": bool,
    "recapture_cuda_graph": bool,
    "token_step": int,
    "flush_cache": bool,
    "manifest": dict | None,
}
# io_struct.py, InitWeightsUpdateGroupReqInput.
INIT_WEIGHTS_UPDATE_GROUP = {
    "rid": str | None,
    "master_address": str,
    "master_port": int,
    "rank_offset": int,
    "world_size": int,
    "group_name": str,
    "backend": str,
}
# io_struct.py, UpdateWeightsFromDistributedReqInput.
UPDATE_WEIGHTS_FROM_DISTRIBUTED = {
    "rid": str | None,
    "names": list[str],
    "dtypes": list[str],
    "shapes": list[list[int]],
    "group_name": str,
    "flush_cache": bool,
    "abort_all_requests": bool,
    "weight_version": str | None,
    "load_format": str | None,
    "torch_empty_cache": bool,
}
# io_struct.py, PauseGenerationReqInput and ContinueGenerationReqInput.
PAUSE_GENERATION = {"rid": str | None, "mode": typing.Literal["abort", "retract", "in_place"]}
CONTINUE_GENERATION = {"rid": str | None, "torch_empty_cache": bool}
# io_struct.py, BeginWeightUpdateReqInput and EndWeightUpdateReqInput (as SGLang's RL users send them:
# radixark/miles miles/backends/sglang_utils/sglang_api_client.py, {"selector": "all"} and {}).
# tests/rollout/test_sglang_structs.py checks every struct above against SGLang's own source.
BEGIN_WEIGHT_UPDATE = {"selector": str}
END_WEIGHT_UPDATE: dict = {}


def conforms(value, tp) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp in (str, bool, dict):
        return isinstance(value, tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if tp is type(None):
        return value is None
    raise AssertionError(f"no check for {tp}")


def assert_shaped_like(body: dict, struct: dict) -> None:
    unknown = sorted(set(body) - set(struct))
    assert not unknown, f"fields SGLang's struct does not have: {unknown}"
    wrong = {k: v for k, v in body.items() if not conforms(v, struct[k])}
    assert not wrong, f"fields of the wrong type: {wrong}"


# --- recorded answers ---------------------------------------------------------------------------------

# Recorded: SGLang's docs, "Structured Outputs" (/generate with sampling_params.n = 3, no logprobs asked),
# rendered in wxsms/sgl-project.github.io markdown/advanced_features/structured_outputs.md from
# sgl-project/sglang docs/advanced_features/structured_outputs.ipynb.
DOCS_GENERATE_N3 = [
    {
        "text": "Paris is the capital of France",
        "output_ids": [60704, 374, 279, 6864, 315, 9822, 128009],
        "meta_info": {
            "id": "64f0ef8beb744a5fae55148366fba6aa",
            "finish_reason": {"type": "stop", "matched": 128009},
            "prompt_tokens": 46,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": 7,
            "cached_tokens": 45,
            "cached_tokens_details": {"device": 45, "host": 0},
            "dp_rank": None,
            "e2e_latency": 0.082012795843184,
            "response_sent_to_client_ts": 1778814405.205137,
        },
    },
] * 3


# Assembled from sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py: _handle_batch_output
# builds meta_info {id, finish_reason, prompt_tokens, weight_version, num_retractions, reasoning_tokens,
# completion_tokens, cached_tokens, e2e_latency} and, with return_logprob, add_logprob_to_meta_info adds
# input_token_logprobs / output_token_logprobs ([logprob, token_id, text-or-null] per token) and
# output_token_logprobs_length; utils/weight_versions.py add_weight_versions_to_meta_info adds
# weight_versions spans and sets weight_version to the last span's. _handle_batch_request returns a batch
# with n > 1 prompt-major (for each prompt, its n samples). finish_reason "length" is {"type": "length",
# "length": max_new_tokens}.
def source_generate(version: str = "step-3", spans: list | None = None) -> list[dict]:
    items = []
    for p, prompt in enumerate(([11, 12], [21, 22, 23])):
        for s in range(2):
            out = [100 * (p + 1) + s, 7]
            meta = {
                "id": f"rid{p}{s}",
                "finish_reason": {"type": "length", "length": 2},
                "prompt_tokens": len(prompt),
                "weight_version": version,
                "num_retractions": 0,
                "input_token_logprobs": [[None, prompt[0], None]] + [[-1.0, t, None] for t in prompt[1:]],
                "output_token_logprobs": [[-0.25, out[0], None], [-0.5, out[1], None]],
                "output_token_logprobs_length": 2,
                "reasoning_tokens": 0,
                "completion_tokens": 2,
                "cached_tokens": 0,
                "e2e_latency": 0.01,
            }
            if spans is not None:
                meta["weight_versions"] = spans
            items.append({"text": "ab", "output_ids": out, "meta_info": meta})
    return items


# sgl-project/sglang python/sglang/srt/entrypoints/http_server.py, update_weights_from_disk: 200 with
# {"success", "message", "num_paused_requests"}, the message "Succeeded to update model weights." (model
# runner) plus " Weight version updated to V."; 400 with success false on failure.
DISK_OK = (
    200,
    {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to step-3.",
        "num_paused_requests": 0,
    },
)
DISK_FAILED = (
    400,
    {
        "success": False,
        "message": "Failed to get weights iterator: /w/x (repo id) not found.",
        "num_paused_requests": 0,
    },
)
# http_server.py init_weights_update_group / update_weights_from_distributed: {"success", "message"}, 400 on
# failure; messages from the model runner's init_weights_update_group and update_weights_from_distributed.
INIT_OK = (200, {"success": True, "message": "Succeeded to initialize custom process group."})
INIT_FAILED = (400, {"success": False, "message": "Failed to initialize custom process group: timed out."})
# http_server.py pause_generation / continue_generation.
PAUSED = (200, {"message": "Generation paused successfully.", "status": "ok"})
CONTINUED = (200, {"message": "Generation continued successfully.", "status": "ok"})
# http_server.py validation_exception_handler: a body SGLang cannot validate is a 400 ErrorResponse.
INVALID = (
    400,
    {
        "object": "error",
        "message": "1 validation error for GenerateReqInput ...",
        "type": "Bad Request",
        "param": None,
        "code": 400,
    },
)
# FastAPI's answer for a route the server does not have (servers older than begin/end_weight_update).
MISSING = (404, {"detail": "Not Found"})


class Replay:
    """Answers each path with a recorded (status, body) and keeps every request body."""

    def __init__(self, answers: dict[str, tuple[int, object]]):
        self.answers, self.seen = answers, []
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # SGLang's /health answers 200 with an empty body while it serves
                self._answer(replay.answers.get(self.path, (200, {}) if self.path == "/health" else MISSING))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                replay.seen.append((self.path, body))
                self._answer(replay.answers.get(self.path, MISSING))

            def _answer(self, recorded):
                status, answer = recorded
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def bodies(self, path: str) -> list:
        return [b for p, b in self.seen if p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replay():
    made = []

    def make(answers):
        made.append(Replay(answers))
        return made[-1]

    yield make
    for r in made:
        r.close()


# --- /generate ------------------------------------------------------------------------------------------


def test_generate_bodies_are_sglang_generate_req_inputs(replay):
    server = replay({"/generate": (200, source_generate())})
    client = HttpRolloutClient(server.url, retries=0)
    reqs = [
        GenerateRequest(
            [11, 12],
            SamplingParams(
                max_new_tokens=2,
                temperature=0.7,
                top_p=0.9,
                top_k=0,
                n=2,
                stop=("\n",),
                stop_token_ids=(7,),
                seed=3,
            ),
            rid="p0",
        ),
        GenerateRequest([21, 22, 23], SamplingParams(max_new_tokens=2, temperature=0.7, top_p=0.9, n=2)),
    ]
    out = client.generate(reqs)
    (body,) = server.bodies("/generate")
    assert_shaped_like(body, GENERATE_REQ_INPUT)
    for params in body["sampling_params"]:
        assert_shaped_like(params, SAMPLING_PARAMS)
        # SamplingParams.verify: top_k must be -1 (disable) or at least 1; 0 is refused.
        assert params["top_k"] == -1 or params["top_k"] >= 1
    # GenerateReqInput._normalize_rid: one rid per prompt, not per sample; all n equal in one batch.
    assert len(body["rid"]) == len(body["input_ids"]) == 2 and body["rid"][0] == "p0"
    assert {p["n"] for p in body["sampling_params"]} == {2}
    assert body["return_logprob"] is True
    # Prompt-major answer: prompt i's samples are items i*n .. i*n+n-1.
    assert [[c.output_ids for c in group] for group in out] == [[[100, 7], [101, 7]], [[200, 7], [201, 7]]]
    first = out[0][0]
    assert first.output_logprobs == [-0.25, -0.5] and first.finish_reason == "length"
    assert first.weight_version == "step-3"
    assert first.meta["completion_tokens"] == 2 and first.meta["id"] == "rid00"


def test_generate_batches_split_by_n_because_sglang_refuses_mixed_n(replay):
    server = replay({"/generate": (200, source_generate()[:2])})
    client = HttpRolloutClient(server.url, retries=0)
    with pytest.raises(RingzeroError):  # the replayed answer fits only the first batch
        client.generate(
            [GenerateRequest([1], SamplingParams(n=2)), GenerateRequest([2], SamplingParams(n=1))]
        )
    assert [{p["n"] for p in b["sampling_params"]} for b in server.bodies("/generate")] == [{2}, {1}]


def test_the_docs_answer_parses_and_a_missing_logprob_is_refused(replay):
    server = replay({"/generate": (200, DOCS_GENERATE_N3)})
    with pytest.raises(RingzeroError, match="0 log-probs for 7 output tokens"):
        HttpRolloutClient(server.url, retries=0).generate([GenerateRequest([1, 2], SamplingParams(n=3))])
    with_logprobs = [
        {
            **item,
            "meta_info": {
                **item["meta_info"],
                "output_token_logprobs": [[-0.1, t, None] for t in item["output_ids"]],
            },
        }
        for item in DOCS_GENERATE_N3
    ]
    server.answers["/generate"] = (200, with_logprobs)
    (group,) = HttpRolloutClient(server.url, retries=0).generate(
        [GenerateRequest([1, 2], SamplingParams(n=3))]
    )
    assert [c.matched_stop for c in group] == [128009] * 3 and group[0].finish_reason == "stop"
    assert group[0].weight_version == "default" and group[0].meta["cached_tokens"] == 45


def test_sglang_error_bodies_reach_the_message(replay):
    server = replay({"/generate": INVALID})
    with pytest.raises(RingzeroError, match=r"HTTP 400: 1 validation error for GenerateReqInput"):
        HttpRolloutClient(server.url, retries=0).generate([GenerateRequest([1])])


def test_weight_version_spans_of_newer_sglang_are_checked(replay):
    spans = [{"version": "step-2", "start": 0, "end": 1}, {"version": "step-3", "start": 1, "end": 2}]
    server = replay(
        {
            "/generate": (200, source_generate("step-3", spans)),
            "/update_weights_from_disk": DISK_OK,
            "/pause_generation": PAUSED,
            "/continue_generation": CONTINUED,
        }
    )
    client = ReplicaSet([server.url], connect=HttpRolloutClient, retries=0, stale="count")
    client.update_weights_from_disk("/w/step-3", "step-3")
    client.generate(
        [
            GenerateRequest([11, 12], SamplingParams(max_new_tokens=2, n=2)),
            GenerateRequest([21, 22, 23], SamplingParams(max_new_tokens=2, n=2)),
        ]
    )
    assert client.pop_metrics() == {"rollout/stale_samples": 4.0}


# --- weight pushes -----------------------------------------------------------------------------------


def test_disk_push_bodies_are_sglang_structs(replay):
    server = replay(
        {"/update_weights_from_disk": DISK_OK, "/pause_generation": PAUSED, "/continue_generation": CONTINUED}
    )
    ReplicaSet([server.url], connect=HttpRolloutClient, retries=0).update_weights_from_disk(
        "/shared-weights/l/step-3", "step-3"
    )
    assert [p for p, _ in server.seen] == [
        "/pause_generation",
        "/update_weights_from_disk",
        "/continue_generation",
    ]
    (pause,), (disk,), (cont,) = (server.bodies(p) for p, _ in server.seen)
    assert_shaped_like(pause, PAUSE_GENERATION)
    assert_shaped_like(cont, CONTINUE_GENERATION)
    assert_shaped_like(disk, UPDATE_WEIGHT_FROM_DISK)
    assert disk["model_path"] == "/shared-weights/l/step-3" and disk["weight_version"] == "step-3"
    assert disk["flush_cache"] is True and disk["abort_all_requests"] is False
    assert "load_format" not in disk  # None there means: the server's own --load-format


def test_a_refused_disk_push_names_the_server_and_its_message(replay):
    server = replay(
        {
            "/update_weights_from_disk": DISK_FAILED,
            "/pause_generation": PAUSED,
            "/continue_generation": CONTINUED,
        }
    )
    with pytest.raises(
        RingzeroError,
        match=rf"{server.url} refused the weight push 'v'.*HTTP 400: Failed to get "
        "weights iterator",
    ):
        ReplicaSet([server.url], connect=HttpRolloutClient, retries=0).update_weights_from_disk("/w/x", "v")
    assert server.seen[-1][0] == "/continue_generation"


def test_distributed_bodies_are_sglang_structs(replay):
    ok = (200, {"success": True, "message": "Succeeded to update parameter online."})
    server = replay(
        {
            "/init_weights_update_group": INIT_OK,
            "/update_weights_from_distributed": ok,
            "/begin_weight_update": (200, {"success": True, "message": ""}),
            "/end_weight_update": (200, {"success": True, "message": ""}),
        }
    )
    client = HttpRolloutClient(server.url, retries=0)
    client.init_weights_update_group(init_group_body("10.1.2.3", 29600, 1, 3, "ringzero-weights", "nccl"))
    client.begin_weight_update()
    client.update_weights_from_distributed(
        distributed_update_body(
            ["model.embed_tokens.weight", "lm_head.weight"],
            ["bfloat16", "float32"],
            [[8, 4], [8, 4]],
            "ringzero-weights",
            "step-1",
        )
    )
    client.end_weight_update()
    (init,) = server.bodies("/init_weights_update_group")
    (update,) = server.bodies("/update_weights_from_distributed")
    assert_shaped_like(init, INIT_WEIGHTS_UPDATE_GROUP)
    assert_shaped_like(update, UPDATE_WEIGHTS_FROM_DISTRIBUTED)
    assert_shaped_like(server.bodies("/begin_weight_update")[0], BEGIN_WEIGHT_UPDATE)
    assert_shaped_like(server.bodies("/end_weight_update")[0], END_WEIGHT_UPDATE)
    assert set(INIT_WEIGHTS_UPDATE_GROUP) - set(init) == {"rid"}  # every field given, none left to a default
    assert update["dtypes"] == [
        "bfloat16",
        "float32",
    ]  # torch dtype names, which SGLang reads with getattr(torch, .)


def test_a_refused_group_join_is_an_error_and_a_missing_session_endpoint_is_not(replay):
    server = replay({"/init_weights_update_group": INIT_FAILED})
    client = HttpRolloutClient(server.url, retries=0)
    with pytest.raises(RingzeroError, match="HTTP 400: Failed to initialize custom process group: timed out"):
        client.init_weights_update_group(
            {
                "master_address": "a",
                "master_port": 1,
                "rank_offset": 1,
                "world_size": 2,
                "group_name": "g",
                "backend": "nccl",
            }
        )
    assert client.begin_weight_update() is False and client.pause_generation() is False  # 404: not there
