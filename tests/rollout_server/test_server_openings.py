"""A forced opening over SGLang's HTTP API: the opening's log-probs come back through ``logprob_start_len``
(``input_token_logprobs``), and the batch equals the one collected from the engine in process."""

from __future__ import annotations

import random

import pytest
import torch
from server_kit import POLICY, tiny_model

from ringzero.rl.openings import Opening
from ringzero.rl.rewards import TaskReward
from ringzero.rl.rollout_batch import collect
from ringzero.rollout.clients.http_client import HttpRolloutClient
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.types import SamplingParams
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.config import ArithmeticTask
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("rollout_server")

TOK = CharTokenizer()


def test_an_opened_batch_over_http_equals_the_in_process_one(real_deterministic):
    task = SyntheticArithmetic(ArithmeticTask(operation="digitsum", digits=4, min_digits=2))
    problems = task.prompts("train", 2, random.Random(0))
    opening = Opening(tuple(TOK.encode("<think> </think>")), samples=2)
    params = SamplingParams(max_new_tokens=24, temperature=1.0, n=4)

    def batch(client):
        return collect(
            client,
            task,
            TOK,
            problems,
            samples=4,
            params=params,
            reward=TaskReward(task),
            seeds=[5, 6],
            opening=opening,
        )

    over_http = batch(HttpRolloutClient(real_deterministic.url, retries=0))
    direct = batch(EmbeddedEngine(tiny_model(0), TOK, POLICY, max_batch=16, deterministic=True))
    assert over_http.forced == direct.forced == [False, False, True, True] * 2
    assert over_http.output_ids == direct.output_ids
    torch.testing.assert_close(over_http.logp_rollout_NT, direct.logp_rollout_NT, atol=1e-6, rtol=0)
    n = len(opening.ids)
    assert (over_http.logp_rollout_NT[2, :n] < 0).all()
