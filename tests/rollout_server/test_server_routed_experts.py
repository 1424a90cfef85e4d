"""``return_routed_experts`` over HTTP: SGLang's body and answer, decoded as slime decodes it, and the client.

SGLang's sources for the shapes checked here:

- the request flag: sgl-project/sglang python/sglang/srt/managers/io_struct.py, ``GenerateReqInput``
  (``return_routed_experts: bool``, ``routed_experts_start_len: int``, rows ``[start, seqlen - 1)``);
- the answer: python/sglang/srt/managers/tokenizer_manager.py / detokenizer_manager.py put
  ``meta_info["routed_experts"] = pybase64.b64encode(tensor.numpy().tobytes())`` of the int32
  ``[seqlen - 1, num_hidden_layers, num_experts_per_tok]`` rows
  (python/sglang/srt/layers/moe/routed_experts_capturer.py, python/sglang/srt/state_capturer/base.py);
- the client side: THUDM/slime slime/rollout/sglang_rollout.py sends ``payload["return_routed_experts"] =
  True`` and reads ``np.frombuffer(pybase64.b64decode(meta_info["routed_experts"].encode("ascii")),
  dtype=np.int32) .reshape(len(sample.tokens) - 1, args.num_layers, args.moe_router_topk)``.
"""

from __future__ import annotations

import base64
import math
import types
import typing

import numpy as np
import pytest
import requests
import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import capture_routing
from ringzero.rollout.clients.http_client import HttpRolloutClient, generate_body, sampling_params_body
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.types import GenerateRequest, LogprobRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

MOE = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    layer_group_size=2,
    head_dim=8,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=6,
    kv_lora_rank=8,
    intermediate_size=48,
    group_norm_size=2,
    num_experts=6,
    n_group=3,
    topk_group=2,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    first_k_dense_replace=1,
    max_position_embeddings=64,
)
F64 = PrecisionPolicy(body="float64", attention_softmax_fp32=True, lm_head_fp32=True)
LAYERS, TOPK = 4, 2


def moe_model() -> HybridLM:
    model = HybridLM(ModelConfig(**MOE), F64)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        random_weights_(model, gen)
    return model.eval()


@pytest.fixture(scope="module")
def reference() -> HybridLM:
    return moe_model()


@pytest.fixture(scope="module")
def moe():
    """The embedded engine on the tiny MoE model behind a server (no tokenizer: no EOS, ids as characters)."""
    engine = EmbeddedEngine(moe_model(), policy=F64, max_batch=8, prefill_chunk=3)
    with ServerThread(
        RolloutServer(engine, CharTokenizer(), model_path="random://moe", vocab_size=64).app
    ) as thread:
        yield thread


def teacher_forced(model: HybridLM, tokens: list[int]) -> np.ndarray:
    """int32 ``[len(tokens) - 1, L, K]`` of a parallel forward over ``tokens[:-1]``, -1 on dense layers."""
    want = np.full((len(tokens) - 1, LAYERS, TOPK), -1, dtype=np.int32)
    with torch.no_grad(), capture_routing(model) as chosen:
        model.hidden(torch.tensor([tokens[:-1]]))
    for layer, experts in chosen.items():
        want[:, layer] = experts[0].numpy()
    return want


def slime_decode(meta: dict, tokens: list[int]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(meta["routed_experts"].encode("ascii")), dtype=np.int32).reshape(
        len(tokens) - 1, LAYERS, TOPK
    )


def post(served, body) -> requests.Response:
    return requests.post(served.url + "/generate", json=body, timeout=120)


def test_an_sglang_body_gets_sglangs_encoding(moe, reference):
    # slime's payload: sampling_params, return_logprob, return_routed_experts (sglang_rollout.py generate()).
    prompt = [5, 9, 14, 20, 33]
    resp = post(
        moe,
        {
            "input_ids": prompt,
            "return_logprob": True,
            "return_routed_experts": True,
            "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "sampling_seed": 3},
        },
    )
    assert resp.status_code == 200, resp.text
    item = resp.json()
    tokens = prompt + item["output_ids"]
    got = slime_decode(item["meta_info"], tokens)
    np.testing.assert_array_equal(got, teacher_forced(reference, tokens))
    assert (got[:, 0] == -1).all()  # the dense first layer
    # Exactly SGLang's bytes: little-endian int32, C order, standard base64 with padding.
    assert item["meta_info"]["routed_experts"] == base64.b64encode(got.astype("<i4").tobytes()).decode(
        "ascii"
    )


def test_batches_n_samples_and_a_per_prompt_flag(moe, reference):
    prompts = [[7, 8], [10, 11, 12, 13, 14, 15]]
    items = post(
        moe,
        {
            "input_ids": prompts,
            "return_routed_experts": [True, False],
            "sampling_params": {"max_new_tokens": 5, "n": 2, "stop_token_ids": [3, 9, 15, 21, 27]},
        },
    ).json()
    assert len(items) == 4  # prompt-major: prompt i's samples at 2i, 2i + 1
    for item in items[:2]:
        tokens = prompts[0] + item["output_ids"]
        np.testing.assert_array_equal(
            slime_decode(item["meta_info"], tokens), teacher_forced(reference, tokens)
        )
    assert all("routed_experts" not in item["meta_info"] for item in items[2:])


def test_absent_unless_asked(moe):
    for extra in ({}, {"return_routed_experts": False}):
        item = post(moe, {"input_ids": [4, 5, 6], "sampling_params": {"max_new_tokens": 2}, **extra}).json()
        assert "routed_experts" not in item["meta_info"]


def test_routed_experts_start_len_keeps_the_later_rows(moe, reference):
    prompt = [12, 13, 14, 15]
    body = {
        "input_ids": prompt,
        "return_routed_experts": True,
        "routed_experts_start_len": 3,
        "sampling_params": {"max_new_tokens": 4, "sampling_seed": 5},
    }
    item = post(moe, body).json()
    tokens = prompt + item["output_ids"]
    rows = np.frombuffer(base64.b64decode(item["meta_info"]["routed_experts"]), dtype=np.int32)
    np.testing.assert_array_equal(rows.reshape(-1, LAYERS, TOPK), teacher_forced(reference, tokens)[3:])
    resp = post(moe, {**body, "routed_experts_start_len": 5})
    assert resp.status_code == 400 and resp.json()["param"] == "routed_experts_start_len"


def test_prefill_only_requests_report_the_prompt_rows(moe, reference):
    prompt = [20, 21, 22, 23, 24]
    item = post(
        moe,
        {
            "input_ids": prompt,
            "return_routed_experts": True,
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 0},
        },
    ).json()
    np.testing.assert_array_equal(slime_decode(item["meta_info"], prompt), teacher_forced(reference, prompt))


def test_a_dense_model_refuses_with_a_400_naming_the_field(real):
    resp = post(
        real, {"text": "1+1=", "return_routed_experts": True, "sampling_params": {"max_new_tokens": 2}}
    )
    assert resp.status_code == 400
    assert resp.json()["param"] == "return_routed_experts" and "no MoE layers" in resp.json()["message"]
    assert (
        post(
            real, {"text": "1+1=", "return_routed_experts": False, "sampling_params": {"max_new_tokens": 2}}
        ).status_code
        == 200
    )
    resp = post(real, {"text": "1+1=", "return_routed_experts": "yes"})
    assert resp.status_code == 400 and resp.json()["param"] == "return_routed_experts"


# --- the HTTP client --------------------------------------------------------------------------------


class Recording(HttpRolloutClient):
    """Keeps every body it posts to /generate."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bodies = []

    def _json(self, method, path, body=None):
        if path == "/generate":
            self.bodies.append(body)
        return super()._json(method, path, body)


def test_client_round_trip(moe, reference):
    client = Recording(moe.url, retries=0, routing_shape=(LAYERS, TOPK))
    reqs = [
        GenerateRequest(
            [30, 31, 32], SamplingParams(max_new_tokens=5, n=2, seed=1), return_routed_experts=True
        ),
        GenerateRequest([40, 41], SamplingParams(max_new_tokens=4, n=2, seed=2)),
        GenerateRequest(
            [50, 51, 52, 53], SamplingParams(max_new_tokens=3, seed=3), return_routed_experts=True
        ),
    ]
    out = client.generate(reqs)
    # SGLang's flag is one bool per body: requests that ask and those that do not go out apart.
    assert [(len(b["input_ids"]), b.get("return_routed_experts")) for b in client.bodies] == [
        (1, True),
        (1, None),
        (1, True),
    ]
    for req, group in zip(reqs, out, strict=True):
        assert len(group) == req.params.n
        for c in group:
            if not req.return_routed_experts:
                assert c.routed_experts is None
                continue
            assert c.routed_experts.dtype == torch.int32
            np.testing.assert_array_equal(
                c.routed_experts.numpy(), teacher_forced(reference, c.prompt_ids + c.output_ids)
            )
            assert "routed_experts" not in c.meta


def test_client_needs_the_routing_shape(moe):
    client = Recording(moe.url, retries=0)
    with pytest.raises(RingzeroError, match=r"routing_shape=\(num_hidden_layers, num_experts_per_tok\)"):
        client.generate([GenerateRequest([1, 2], return_routed_experts=True)])
    assert client.bodies == []  # refused before anything was sent
    client.routing_shape = (LAYERS, 3)  # the wrong shape: the answer does not fit it
    with pytest.raises(RingzeroError, match=r"holds \d+ expert ids"):
        client.generate(
            [GenerateRequest([1, 2], SamplingParams(max_new_tokens=2), return_routed_experts=True)]
        )


# sgl-project/sglang python/sglang/srt/managers/io_struct.py GenerateReqInput: the fields the client sends.
GENERATE_REQ_INPUT = {
    "rid": str | list[str] | None,
    "input_ids": list[list[int]] | list[int] | None,
    "sampling_params": list[dict] | dict | None,
    "return_logprob": list[bool] | bool | None,
    "logprob_start_len": list[int] | int | None,
    "top_logprobs_num": list[int] | int | None,
    "return_routed_experts": bool,
}


def conforms(value, tp) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if tp is type(None):
        return value is None
    return isinstance(value, tp) and (tp is bool or not isinstance(value, bool))


def test_bodies_are_sglang_shaped():
    lp = LogprobRequest(prompt_from=1, top_k=3)
    body = generate_body(
        [
            GenerateRequest(
                [1, 2, 3], SamplingParams(ignore_eos=True), logprobs=lp, return_routed_experts=True
            ),
            GenerateRequest([4, 5], SamplingParams()),
        ]
    )
    assert set(body) <= set(GENERATE_REQ_INPUT) and all(
        conforms(v, GENERATE_REQ_INPUT[k]) for k, v in body.items()
    )
    # Lists per prompt (n == 1): -1 is SGLang's "output tokens only", 0 its "no top-k".
    assert body["logprob_start_len"] == [1, -1] and body["top_logprobs_num"] == [3, 0]
    assert body["return_routed_experts"] is True
    assert body["sampling_params"][0]["ignore_eos"] is True and "ignore_eos" not in body["sampling_params"][1]
    assert sampling_params_body(SamplingParams(ignore_eos=True))["ignore_eos"] is True
    plain = generate_body([GenerateRequest([1, 2])])
    assert not {"logprob_start_len", "top_logprobs_num", "return_routed_experts"} & set(plain)


def test_client_sends_and_reads_the_logprob_fields(moe):
    # n > 1: SGLang refuses per-prompt lists ("Cannot use list logprob_start_len with parallel_sample_num >
    # 1"), so requests that disagree on them go out in separate bodies, each with one value.
    client = Recording(moe.url, retries=0, routing_shape=(LAYERS, TOPK))
    reqs = [
        GenerateRequest(
            [6, 7, 8, 9],
            SamplingParams(max_new_tokens=3, n=2, seed=1),
            logprobs=LogprobRequest(prompt_from=1, top_k=2),
        ),
        GenerateRequest([6, 7, 8], SamplingParams(max_new_tokens=3, n=2, seed=2, ignore_eos=True)),
    ]
    out = client.generate(reqs)
    assert [(b.get("logprob_start_len"), b.get("top_logprobs_num")) for b in client.bodies] == [
        (1, 2),
        (None, None),
    ]
    assert client.bodies[1]["sampling_params"][0]["ignore_eos"] is True
    direct = EmbeddedEngine(moe_model(), policy=F64).generate(reqs[:1])
    for got, want in zip(out[0], direct[0], strict=True):
        assert got.output_ids == want.output_ids
        assert got.prompt_logprobs[0] is None and len(got.prompt_logprobs) == 3
        for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:], strict=True):
            assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)
        assert [[t for _, t in top] for top in got.output_top_logprobs] == [
            [t for _, t in top] for top in want.output_top_logprobs
        ]
        assert len(got.prompt_top_logprobs) == 3 and got.prompt_top_logprobs[0] is None
    assert all(c.prompt_logprobs is None and c.output_top_logprobs is None for c in out[1])
