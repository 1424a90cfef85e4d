"""The real embedded engine on a tiny random model: HTTP round trips equal in-process generation."""

from __future__ import annotations

import pytest
import requests
import torch
from server_kit import POLICY, same_samples, tiny_model

from ringzero.model.checkpoint import save_model
from ringzero.model.tolerances import compare
from ringzero.rollout.clients.http_client import HttpRolloutClient
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.store import open_store
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def in_process(seed: int = 0, deterministic: bool = False) -> EmbeddedEngine:
    """An engine like the served one, on its own copy of the same weights."""
    return EmbeddedEngine(tiny_model(seed), TOK, POLICY, max_batch=16, deterministic=deterministic)


def rollout_requests(mixed_n: bool) -> list[GenerateRequest]:
    n = 1 if mixed_n else 3
    # top-k/top-p only in the one-batch case: the engine picks its sampling path per batch (any row
    # filtered -> sorted inverse CDF for all rows), so a filtered row changes its batch-mates' draws.
    top_k, top_p = (0, 1.0) if mixed_n else (8, 0.9)
    return [
        GenerateRequest(
            TOK.encode("12+34="), SamplingParams(max_new_tokens=6, temperature=1.0, seed=11, n=3)
        ),
        GenerateRequest(
            TOK.encode("7*8="), SamplingParams(max_new_tokens=5, temperature=0.7, top_k=top_k, seed=12, n=3)
        ),
        GenerateRequest(TOK.encode("9-"), SamplingParams(max_new_tokens=4, temperature=0.0, n=n)),
        GenerateRequest(
            TOK.encode("ab"), SamplingParams(max_new_tokens=8, top_p=top_p, seed=13, stop=("a",), n=n)
        ),
    ]


def assert_same(over_http, direct):
    assert [len(g) for g in over_http] == [len(g) for g in direct]
    for got, want in zip(over_http, direct, strict=True):
        for a, b in zip(got, want, strict=True):
            assert same_samples(a, b), (a, b)


@pytest.mark.parametrize("served,batching", [("real", "continuous"), ("real_static", "static")])
def test_http_client_round_trip_equals_the_in_process_engine(served, batching, request):
    # One n for all: the client sends them as one /generate, so the engine sees the same batch: a static
    # group or a continuous batch of its own (whose free slots round fp32 differently from a static group).
    real = request.getfixturevalue(served)
    client = HttpRolloutClient(real.url, timeout_s=60, retries=0)
    over_http = client.generate(rollout_requests(mixed_n=False))
    engine = in_process()
    direct = engine.open_batch().run if batching == "continuous" else engine.generate
    assert_same(over_http, direct(rollout_requests(mixed_n=False)))
    assert [len(g) for g in over_http] == [3] * 4
    assert len({tuple(c.output_ids) for c in over_http[0]}) > 1  # n samples differ


def test_mixed_n_round_trip_equals_the_in_process_engine_when_deterministic(real_deterministic):
    # Mixed n goes out as one /generate per n (SGLang's rule), so the engine's batches differ from
    # the in-process call; batch-invariant log-probs make that invisible.
    client = HttpRolloutClient(real_deterministic.url, timeout_s=60, retries=0)
    over_http = client.generate(rollout_requests(mixed_n=True))
    assert [len(g) for g in over_http] == [3, 3, 1, 1]
    assert_same(over_http, in_process(deterministic=True).generate(rollout_requests(mixed_n=True)))


def served_and_direct(url: str):
    body = {
        "text": ["12+34=", "ab"],
        "return_logprob": True,
        "sampling_params": [
            {"max_new_tokens": 6, "sampling_seed": 11},
            {"max_new_tokens": 8, "top_p": 0.9, "sampling_seed": 13, "stop": "a"},
        ],
    }
    out = requests.post(url + "/generate", json=body, timeout=60).json()
    direct = in_process().generate(
        [
            GenerateRequest(TOK.encode("12+34="), SamplingParams(max_new_tokens=6, seed=11)),
            GenerateRequest(
                TOK.encode("ab"), SamplingParams(max_new_tokens=8, top_p=0.9, seed=13, stop=("a",))
            ),
        ]
    )
    return out, direct


def test_static_batching_serves_the_engines_log_probs_bit_for_bit(real_static):
    out, direct = served_and_direct(real_static.url)
    for item, (c,) in zip(out, direct, strict=True):
        assert item["output_ids"] == c.output_ids
        assert [e[0] for e in item["meta_info"]["output_token_logprobs"]] == c.output_logprobs


def test_generate_logprobs_equal_the_engines_and_stop_strings_hold(real):
    out, direct = served_and_direct(real.url)
    for item, (c,) in zip(out, direct, strict=True):
        assert item["output_ids"] == c.output_ids
        # Continuous batching lets the second prompt join the running batch a step or more later, so the
        # server's batches are shaped unlike the in-process call's: the same math in another padding and
        # summation order, equal at the fp32 tolerance, not bit for bit (the deterministic engine is:
        # test_mixed_n_round_trip_equals_the_in_process_engine_when_deterministic).
        served = torch.tensor([e[0] for e in item["meta_info"]["output_token_logprobs"]])
        assert compare(served, torch.tensor(c.output_logprobs), torch.float32)["ok"]
        if c.finish_reason == "stop" and isinstance(c.matched_stop, str):
            assert item["meta_info"]["finish_reason"] == {"type": "stop", "matched": c.matched_stop}
            assert c.matched_stop not in item["text"]


def test_weight_update_from_a_checkpoint_changes_outputs_and_version(real, tmp_path):
    uri = save_model(open_store(f"file://{tmp_path}/store"), "step-1", tiny_model(1))
    client = HttpRolloutClient(real.url, timeout_s=60, retries=0)
    reqs = [GenerateRequest(TOK.encode("3+5="), SamplingParams(max_new_tokens=6, seed=21, n=2))]
    before = client.generate(reqs)
    client.update_weights_from_disk(uri, "1")
    after = client.generate(reqs)
    assert {c.weight_version for c in before[0]} == {"0"}
    assert {c.weight_version for c in after[0]} == {"1"}
    assert [c.output_logprobs for c in after[0]] != [c.output_logprobs for c in before[0]]
    reference = EmbeddedEngine(tiny_model(1), TOK, POLICY, max_batch=16, weight_version="1")
    for a, b in zip(after[0], reference.generate(reqs)[0], strict=True):
        assert same_samples(a, b)
    assert client.model_info()["model_path"] == uri
    assert client.model_info()["weight_version"] == "1"


def test_a_prompt_longer_than_the_context_is_a_400(real):
    resp = requests.post(real.url + "/generate", json={"input_ids": [5] * 48}, timeout=60)
    assert resp.status_code == 400
    assert "max_position_embeddings" in resp.json()["message"]


def test_health_and_model_info(real):
    client = HttpRolloutClient(real.url, timeout_s=60, retries=0)
    assert client.health() is True
    assert client.model_info() == {
        "model_path": "random://seed-0",
        "tokenizer_path": None,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "0",
    }
