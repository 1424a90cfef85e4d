"""Self-distillation: the shortest correct sample per prompt is the target, and the stage shortens the
policy."""

import pytest
import torch
from micro_policy import MODEL, Micro, micro, patch_task

from ringzero.config.stages import DistillStage
from ringzero.errors import RingzeroError
from ringzero.model.logprobs import token_logprobs
from ringzero.stages import distill, train_state
from ringzero.stages.base import StageInputs
from ringzero.stages.distill_data import (
    Sample,
    epoch_order,
    random_correct,
    response_loss,
    sft_batch,
    shortest_correct,
)
from ringzero.tokenizer import CharTokenizer

pytestmark = pytest.mark.xdist_group("micro-policy")

STAGE = {
    "name": "distill",
    "kind": "distill",
    "prompts": 8,
    "samples_per_prompt": 8,
    "epochs": 3,
    "batch_size": 4,
    "max_seq_len": 160,
    "sampling": {"max_new_tokens": 100},
    "optim": {"lr": 1e-3, "warmup_steps": 2},
}


def s(length: int, correct: bool = True, truncated: bool = False, verified: bool = False) -> Sample:
    return Sample(list(range(length)), correct, truncated, verified)


def test_the_target_is_the_shortest_correct_finished_sample():
    samples = [s(5), s(3, correct=False), s(2, truncated=True), s(4), s(4), s(9)]
    assert shortest_correct(samples) == 3  # not the wrong 3, not the truncated 2; the first of the two 4s
    assert shortest_correct(samples, length_budget=4) == 3
    assert shortest_correct(samples, length_budget=3) is None
    assert shortest_correct([s(3, correct=False), s(2, truncated=True)]) is None


def test_a_verified_trace_beats_a_shorter_lucky_answer():
    samples = [s(2), s(40, verified=True), s(30, verified=True), s(25)]  # a bare guess, two checked traces
    assert shortest_correct(samples) == 2
    assert shortest_correct(samples, length_budget=28) == 0  # no checked trace fits: the shortest correct


def test_the_random_control_keeps_the_same_prompts_and_prefers_verified_traces():
    import random

    samples = [s(2), s(40, verified=True), s(30, verified=True), s(25), s(9, correct=False)]
    rng = random.Random(0)
    picks = [random_correct(samples, rng) for _ in range(400)]
    assert set(picks) == {1, 2}  # only the verified ones, both drawn
    assert 0.4 < picks.count(2) / len(picks) < 0.6
    assert random_correct(samples, rng, length_budget=28) in (0, 3)  # no verified trace fits: any correct
    for group in ([s(3, correct=False), s(2, truncated=True)], [s(4)], [s(4, verified=True), s(2)]):
        assert (random_correct(group, rng) is None) == (shortest_correct(group) is None)


def test_the_loss_reads_response_tokens_only():
    examples = [{"prompt_ids": [1, 7, 8], "output_ids": [9, 10]}, {"prompt_ids": [1, 7], "output_ids": [11]}]
    ids, mask = sft_batch(examples, pad_id=0)
    assert ids.tolist() == [[1, 7, 8, 9, 10], [1, 7, 11, 0, 0]]
    # Column t predicts token t + 1: row 0 learns 9 and 10, row 1 learns 11; prompts and padding nothing.
    assert mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    torch.manual_seed(0)
    from ringzero.model.config import ModelConfig, PrecisionPolicy
    from ringzero.model.hybrid import HybridLM

    model = HybridLM(ModelConfig.model_validate(MODEL), PrecisionPolicy())
    with torch.no_grad():
        logp = token_logprobs(model(ids[:, :-1]), ids[:, 1:])
        expected = -(logp[0, 2] + logp[0, 3] + logp[1, 1]) / 3
        assert float(response_loss(model, ids, mask)) == pytest.approx(float(expected), rel=1e-6)


def test_epoch_orders_are_permutations_fixed_by_seed_and_epoch():
    assert sorted(epoch_order(10, 3, 0)) == list(range(10))
    assert epoch_order(10, 3, 1) == epoch_order(10, 3, 1) != epoch_order(10, 3, 0)


@pytest.fixture
def policy(micro_policy_store) -> Micro:
    return micro(micro_policy_store, [STAGE])


def run_distill(m: Micro, root, **changes):
    stage = DistillStage.model_validate({**STAGE, **changes})
    ctx = m.context(root)
    return ctx, distill.run(ctx, stage, StageInputs(init_uri=m.policy_uri, base_uri=m.policy_uri))


def test_distillation_trains_on_terse_traces_and_shortens_the_policy(policy, tmp_path, monkeypatch):
    task = patch_task(monkeypatch, distill)
    ctx, outcome = run_distill(policy, tmp_path)
    s = outcome.summary
    plan = policy.store.get_json(f"{ctx.checkpoint_prefix}/distill-set.json")
    tok = CharTokenizer()
    terse = {
        tok.encode(p.prompt, add_bos=True).__repr__(): tok.encode(task.worked_response(p, False) + "\n")
        for p in task.fixed
    }
    # Every sampled prompt had a correct terse trace among its 8 samples, so each target is one.
    assert len(plan["examples"]) == 8 == s["distill/kept"]
    assert all(e["output_ids"] == terse[repr(e["prompt_ids"])] and e["verified"] for e in plan["examples"])
    assert s["distill/kept_len_mean"] < s["distill/sample_len_mean"]
    # The policy answered half verbosely before; after, its held-out responses are about terse length.
    assert s["distill/compression"] == pytest.approx(1 - s["distill/len_after"] / s["distill/len_before"])
    assert s["distill/compression"] > 0.15
    assert s["distill/acc_after"] >= s["distill/acc_before"] - 0.1
    assert s["len/mean"] == s["distill/len_after"] and s["eval/accuracy"] == s["distill/acc_after"]
    assert policy.store.load(outcome.output_uri).meta["examples"] == 8
    before, after = (r for r in ctx.metrics.records if "len/mean" in r)
    assert (before["step"], after["step"]) == (0, outcome.steps) and after["len/mean"] < before["len/mean"]


def test_an_interrupted_distillation_resumes_after_its_last_epoch_to_the_same_weights(
    policy, tmp_path, monkeypatch
):
    patch_task(monkeypatch, distill)
    _, whole = run_distill(policy, tmp_path / "whole")

    saved = train_state.save_resume_point

    def crash_after_first_epoch(*args, **kwargs):
        saved(*args, **kwargs)
        raise KeyboardInterrupt("killed after the first resume point")

    monkeypatch.setattr(train_state, "save_resume_point", crash_after_first_epoch)
    with pytest.raises(KeyboardInterrupt):
        run_distill(policy, tmp_path / "cut")
    monkeypatch.setattr(train_state, "save_resume_point", saved)
    monkeypatch.setattr(
        distill, "collect", lambda *a, **k: pytest.fail("a resumed stage must not sample again")
    )
    trained = []
    real_step = distill.lm_step
    monkeypatch.setattr(distill, "lm_step", lambda *a, **k: trained.append(1) or real_step(*a, **k))
    _, resumed = run_distill(policy, tmp_path / "cut")
    assert (
        resumed.steps == 6 and len(trained) == 4
    )  # 8 examples / batch 4 = 2 steps per epoch; epoch 1 not redone
    a, b = policy.store.load(whole.output_uri).tensors, policy.store.load(resumed.output_uri).tensors
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_restarting_from_the_base_needs_a_base(policy, tmp_path, monkeypatch):
    patch_task(monkeypatch, distill)
    stage = DistillStage.model_validate({**STAGE, "init_weights": "base"})
    with pytest.raises(RingzeroError, match="init_weights is 'base' but the run has no base"):
        distill.run(policy.context(tmp_path), stage, StageInputs(init_uri=policy.policy_uri))
