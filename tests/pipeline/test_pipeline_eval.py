"""The eval stage: its estimators against hand-computed values, and a comparison of real checkpoints."""

import dataclasses
import math

import pytest
import torch
from micro_policy import DIGITS, Micro, micro, patch_task

from ringzero.config.stages import EvalStage, Tier
from ringzero.model.checkpoint import save_model
from ringzero.model.hybrid import HybridLM
from ringzero.pipeline.execute import execute_stage
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tier_metrics import tier_metrics
from ringzero.stages import evaluate
from ringzero.stages.base import StageInputs
from ringzero.stages.eval_metrics import (
    comprehensibility,
    efficiency,
    final_answer,
    mean_pass_at_k,
    pairwise_agreement,
    pass_at_k,
    reproducibility,
)
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tasks.config import ArithmeticTask

pytestmark = pytest.mark.xdist_group("micro-policy")


# --- estimators --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 4, 1.0),  # only 3 wrong samples: any 4 contain a correct one
        (8, 0, 4, 0.0),
        (8, 8, 1, 1.0),
    ],
)
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_averages_over_prompts_and_refuses_impossible_counts():
    assert mean_pass_at_k([[True, False, False, False], [False] * 4, [True] * 4], 2) == pytest.approx(
        (0.5 + 0 + 1) / 3
    )
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_reproducibility_is_pairwise_agreement_of_final_answers():
    # Prompt 1: "3" twice, "5", no answer: 1 agreeing pair out of 6 (x2 ordered) -> 2/12.
    assert pairwise_agreement(["3", "3", "5", None]) == pytest.approx(2 / 12)
    assert pairwise_agreement(["1"] * 4) == 1.0
    assert pairwise_agreement([None, None]) == 0.0  # two samples without an answer do not agree
    assert math.isnan(pairwise_agreement(["1"]))
    assert reproducibility([["3", "3", "5", None], ["1"] * 4, ["1"]]) == pytest.approx((2 / 12 + 1) / 2)


def test_final_answers_are_read_after_the_trace_and_normalised():
    assert final_answer("<think> a=6>6 b=6>2 </think> 2\n") == "2"
    assert final_answer("07\n") == "7"
    assert final_answer("<think> a=6>6 b=6>2") is None  # an unclosed trace gives no answer


def test_efficiency_and_comprehensibility():
    assert efficiency([True, False, True], [10, 20, 10]) == pytest.approx(1000 * 2 / 40)
    assert comprehensibility([(4, 4), (4, 3), (0, 0)]) == pytest.approx(
        1 / 3
    )  # no step parsed: not comprehensible
    assert math.isnan(comprehensibility([]))


def hand_batch() -> tuple[RolloutBatch, SyntheticArithmetic]:
    """Two prompts, three samples each, with responses whose verdicts are known."""
    task = SyntheticArithmetic(ArithmeticTask(digits=DIGITS))
    p, q = task.prompts("train", 2, 0)
    wrong_answer = "9" if p.answer != "9" else "8"
    broken = f"<think> a=1>1 b=1>1 c=1>1 d=1>1 </think> {p.answer}\n"  # right answer, steps that do not hold
    responses = [
        task.worked_response(p, False) + "\n",
        broken,
        wrong_answer + "\n",
        task.worked_response(q, True) + "\n",
        task.worked_response(q, False) + "\n",
        "<think> a=1\n",
    ]
    lengths = [len(r) for r in responses]
    problems = [p] * 3 + [q] * 3
    n, width = len(responses), max(lengths)
    batch = RolloutBatch(
        problems=problems,
        prompt_ids=[[1]] * n,
        output_ids=[[5] * m for m in lengths],
        responses=responses,
        logp_rollout_NT=torch.zeros(n, width, dtype=torch.float64),
        mask_NT=torch.arange(width)[None] < torch.tensor(lengths)[:, None],
        rewards_N=torch.zeros(n),
        correct=[task.reward(pr, r) == 1.0 for pr, r in zip(problems, responses, strict=True)],
        truncated=[False] * n,
        uses_trace=[task.uses_trace(r) for r in responses],
        group_size=3,
    )
    return batch, task


def test_sampled_qualities_of_a_hand_made_batch():
    batch, task = hand_batch()
    assert batch.correct == [True, True, False, True, True, False]
    got = evaluate.sampled_qualities(batch, task, k=3)
    assert got["eval/accuracy"] == pytest.approx(4 / 6) and got["eval/pass@1"] == pytest.approx(4 / 6)
    assert got["eval/pass@k"] == 1.0  # both prompts have a correct sample among their three
    assert got["eval/trace_rate"] == pytest.approx(5 / 6)
    # Traces: p terse (holds), p broken (0 of 4 hold after the first), q verbose, q terse, q unclosed.
    assert got["eval/comprehensibility"] == pytest.approx(3 / 5)
    # p: answers (x, x, wrong) -> 2 of 6 ordered pairs agree; q: (y, y, none) -> 2 of 6.
    assert got["eval/reproducibility"] == pytest.approx(2 / 6)
    assert got["eval/efficiency"] == pytest.approx(1000 * 4 / sum(batch.lengths))
    assert got["eval/len_max"] == max(batch.lengths) and got["eval/direct_accuracy"] == 0.0


def test_tier_numbers_count_responses_within_the_budget():
    batch, task = hand_batch()
    assert batch.lengths == [
        43,
        43,
        2,
        69,
        43,
        12,
    ]  # p terse, p broken, p wrong, q verbose, q terse, unclosed
    asked = dataclasses.replace(batch, problems=[task.with_tier(p, "[fast]") for p in batch.problems])
    got = tier_metrics(task, asked, [Tier(name="fast", tag="[fast]", budget=43)], tiered="eval")
    assert (
        tier_metrics(task, batch, [Tier(name="fast", tag="[fast]", budget=43)], tiered="eval") == {}
    )  # untiered
    assert got["eval/fast/within_budget"] == pytest.approx(5 / 6)  # all but the verbose trace
    assert got["eval/fast/correct_within_budget"] == pytest.approx(3 / 6)  # p terse, p broken, q terse
    assert got["eval/fast/accuracy"] == pytest.approx(4 / 6) and got["eval/fast/len_mean"] == pytest.approx(
        212 / 6
    )


# --- the stage on real checkpoints
# ---------------------------------------------------------------------------

TIERS = [{"name": "fast", "tag": "[fast]", "budget": 50}, {"name": "deep", "tag": "[deep]", "budget": 100}]
TIER_STAGE = {
    "name": "tier",
    "kind": "rl",
    "steps": 1,
    "prompts_per_step": 1,
    "samples_per_prompt": 2,
    "minibatches": 1,
    "tiers": TIERS,
}
EVAL = {"name": "eval", "kind": "eval", "prompts": 4, "k": 4, "sampling": {"max_new_tokens": 100}}


@pytest.fixture
def models(micro_policy_store) -> tuple[Micro, str]:
    m = micro(micro_policy_store, [TIER_STAGE, EVAL])
    if not (uris := m.store.list("untrained")):
        torch.manual_seed(1)
        uris = [save_model(m.store, "untrained", HybridLM(m.cfg.model, m.cfg.precision.train))]
    return m, uris[0]


def run_eval(m: Micro, root, compare: dict, cfg=None, stage_doc: dict = EVAL):
    stage = EvalStage.model_validate(stage_doc)
    inputs = StageInputs(init_uri=m.policy_uri, compare=compare)
    return execute_stage(cfg or m.cfg, m.store, stage, inputs, root)  # commits the outcome: strict JSON


def test_eval_compares_checkpoints_on_accuracy_length_tiers_qualities_and_ratio_tail(
    models, tmp_path, monkeypatch
):
    m, base_uri = models
    patch_task(monkeypatch, evaluate)
    ex = run_eval(m, tmp_path, {"untrained": base_uri})
    table = ex.outcome.extra["comparison"]
    assert [r["checkpoint"] for r in table["rows"]] == ["untrained", "input"]
    assert [label for _, label in table["columns"]][-8:] == [
        "fast acc",
        "fast len",
        "fast within 50",
        "deep acc",
        "deep len",
        "deep within 100",
        "deep-fast acc (all)",
        "deep/fast len (all)",
    ]  # one length: no per-bucket contrast
    untrained, policy = (r["values"] for r in table["rows"])
    # The fine-tuned policy answers its four problems with worked traces; the untrained model never does.
    assert policy["eval/greedy_accuracy"] == 1.0 and policy["eval/trace_rate"] == 1.0
    assert policy["eval/pass@k"] >= policy["eval/accuracy"] >= 0.75
    assert policy["eval/comprehensibility"] >= 0.75 and policy["eval/reproducibility"] >= 0.5
    assert policy["eval/efficiency"] == pytest.approx(
        1000 * policy["eval/accuracy"] / policy["eval/len_mean"]
    )
    assert untrained["eval/accuracy"] <= 0.25 and untrained["eval/trace_rate"] == 0.0
    assert "eval/comprehensibility" not in untrained  # no trace to judge: left out, not NaN
    # Both engines run fp32 here: the only gap is decoding vs the parallel forward, a few ulps.
    assert 0 < policy["eval/ratio/max"] < 5e-3  # fp32 rounding, decoding vs parallel form
    for tier in ("fast", "deep"):
        assert 0 <= policy[f"eval/{tier}/correct_within_budget"] <= policy[f"eval/{tier}/within_budget"] <= 1
    assert policy["eval/deep/within_budget"] >= policy["eval/fast/within_budget"]
    s = ex.outcome.summary
    assert s["eval/accuracy"] == policy["eval/accuracy"] and s["len/mean"] == policy["eval/len_mean"]
    assert (
        s["ratio/p99"] == policy["eval/ratio/p99"]
        and s["compare/untrained/accuracy"] == untrained["eval/accuracy"]
    )
    # eval scores the weights that sampled: its tail is the engine gap, and fills the stage table's gap
    # columns
    assert s["gap/ratio/p99"] == policy["eval/ratio/p99"] and s["gap/ratio/max"] == policy["eval/ratio/max"]
    assert [r["step"] for r in ex.metrics] == [0, 1] and ex.outcome.steps == 2


def test_the_input_is_measured_once_under_its_stage_name_and_deterministic_mode_closes_the_gap(
    models, tmp_path, monkeypatch
):
    m, base_uri = models
    patch_task(monkeypatch, evaluate)
    cfg = m.cfg.model_copy(update={"precision": m.cfg.precision.model_copy(update={"deterministic": True})})
    # Deterministic decoding runs the full forward at every step: two problems, two samples each (every
    # sampled token's ratio must still be exactly 1) are 6 decodes with the greedy ones, not the full 20.
    small = {**EVAL, "prompts": 2, "k": 2}
    ex = run_eval(m, tmp_path, {"policy": m.policy_uri}, cfg=cfg, stage_doc=small)
    (row,) = ex.outcome.extra["comparison"]["rows"]
    assert row["checkpoint"] == "policy" and row["values"]["eval/ratio/max"] == 0.0
    assert row["values"]["eval/len_mean"] > 10  # the tail is over sampled traces, not an empty batch


def die_on_the_second_measurement(monkeypatch) -> list[str]:
    """Make the eval stage's second checkpoint measurement raise, as a killed run would; returns the URIs
    measured, in order, across every call that follows."""
    measured = []
    real = evaluate.measure_checkpoint

    def measure_then_die_on_the_second(cfg, store, uri, *rest):
        measured.append(uri)
        if len(measured) == 2:
            raise KeyboardInterrupt("killed")
        return real(cfg, store, uri, *rest)

    monkeypatch.setattr(evaluate, "measure_checkpoint", measure_then_die_on_the_second)
    return measured


def test_an_interrupted_eval_keeps_the_rows_it_finished(models, tmp_path, monkeypatch):
    m, base_uri = models
    patch_task(monkeypatch, evaluate)
    measured = die_on_the_second_measurement(monkeypatch)
    stage, inputs = (
        EvalStage.model_validate(EVAL),
        StageInputs(init_uri=m.policy_uri, compare={"untrained": base_uri}),
    )
    with pytest.raises(KeyboardInterrupt):
        evaluate.run(m.context(tmp_path), stage, inputs)
    outcome = evaluate.run(m.context(tmp_path), stage, inputs)
    assert measured == [base_uri, m.policy_uri, m.policy_uri]  # the untrained row was not measured again
    assert [r["checkpoint"] for r in outcome.extra["comparison"]["rows"]] == ["untrained", "input"]


def test_each_prompt_samples_from_its_own_stream(models, tmp_path, monkeypatch):
    """A seed shared by every prompt gives sample j of each prompt the same uniforms, so a rare choice
    (opening a trace) happens for all prompts at once or for none: the same prompt asked twice must
    get different samples, and a rerun the same ones."""
    m, base_uri = models
    patch_task(monkeypatch, evaluate)
    seen = []
    real = evaluate.sampled_qualities

    def record(batch, task, k):
        seen.append(batch.responses)
        return real(batch, task, k)

    monkeypatch.setattr(evaluate, "sampled_qualities", record)
    stage = EvalStage.model_validate({**EVAL, "prompts": 8})  # the four problems, each asked twice
    task, tokenizer = evaluate.task_and_tokenizer(m.cfg)
    problems = task.prompts("eval", stage.prompts)
    assert problems[0] == problems[4]
    for _ in range(2):
        evaluate.measure_checkpoint(m.cfg, m.store, base_uri, stage, task, tokenizer, problems, [])
    first, again = seen
    k = stage.k
    assert first[:k] != first[4 * k : 5 * k]  # same prompt, different streams (an untrained model at T=1)
    assert first == again


def test_force_measures_every_row_again(models, tmp_path, monkeypatch):
    """``--force`` means start over: rows an interrupted run kept are measured again, not reused."""
    m, base_uri = models
    patch_task(monkeypatch, evaluate)
    measured = die_on_the_second_measurement(monkeypatch)
    # An identity of its own: the store is shared, and a finished outcome would be returned unmeasured.
    stage = EvalStage.model_validate({**EVAL, "prompts": 3})
    inputs = StageInputs(init_uri=m.policy_uri, compare={"untrained": base_uri})
    with pytest.raises(KeyboardInterrupt):
        execute_stage(m.cfg, m.store, stage, inputs, tmp_path)
    execute_stage(m.cfg, m.store, stage, inputs, tmp_path, force=True)
    assert measured == [base_uri, m.policy_uri, base_uri, m.policy_uri]
