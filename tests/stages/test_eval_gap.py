"""The eval stage's train/rollout gap: its statistics against hand-computed values, then the stage on a
micro checkpoint (every key, a negative control, and bf16 against FP32 islands)."""

import math
from dataclasses import dataclass

import pytest
import torch
from stage_kit import context, run_config

from ringzero.config.stages import EvalStage
from ringzero.model.checkpoint import save_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.stages import evaluate
from ringzero.stages.base import StageInputs
from ringzero.stages.eval_gap import THIRDS, gap_values, length_thirds, scored_rows
from ringzero.store import open_store

STATS = ("ratio/p99", "ratio/max", "seq_abs_log_ratio")

# --- statistics
# ------------------------------------------------------------------------------------------------

# log r per token of seven responses; lengths 2, 1, 2, 3, 2, 1, 3 (ties at every length).
LOG_R = [[0.1, -0.2], [0.3], [0.0, math.log(2)], [0.01, 0.02, 0.03], [-0.5, 0.05], [-0.05], [0.2, -0.1, 0.4]]


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default), by hand."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    return s[lo] + (pos - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])


def reference(responses: list[list[float]]) -> dict[str, float]:
    ratio = [abs(math.expm1(x)) for r in responses for x in r]
    return {
        "ratio/p99": quantile(ratio, 0.99),
        "ratio/max": max(ratio),
        "seq_abs_log_ratio": sum(abs(math.fsum(r)) for r in responses) / len(responses),
    }


def as_logprobs(log_r: list[list[float]]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """fp64 log-prob pairs whose difference is ``log_r``: train = -1 - 0.1 i, policy = train - log r."""
    train = [torch.tensor([-1.0 - 0.1 * i for i in range(len(r))], dtype=torch.float64) for r in log_r]
    return train, [t - torch.tensor(r, dtype=torch.float64) for t, r in zip(train, log_r, strict=True)]


def test_thirds_rank_by_length_with_ties_in_batch_order():
    # Stable ranking: 1, 5 (length 1), then 0, 2, 4 (length 2), then 3, 6 (length 3); 7 = 3 + 2 + 2.
    assert [t.tolist() for t in length_thirds([2, 1, 2, 3, 2, 1, 3])] == [[1, 5, 0], [2, 4], [3, 6]]
    assert [t.tolist() for t in length_thirds([5] * 6)] == [[0, 1], [2, 3], [4, 5]]  # all tied: batch order


def test_gap_values_match_a_hand_computed_fp64_reference():
    got = gap_values(*as_logprobs(LOG_R), "eval/gap/bf16")
    thirds = {"short": [1, 5, 0], "mid": [2, 4], "long": [3, 6]}
    want = {f"eval/gap/bf16/{k}": v for k, v in reference(LOG_R).items()}
    for third, idx in thirds.items():
        want.update({f"eval/gap/bf16/{third}/{k}": v for k, v in reference([LOG_R[i] for i in idx]).items()})
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    # spot checks in closed form: max |r - 1| is r = 2 (log 2); the long third's |sums| are 0.06 and 0.5
    assert got["eval/gap/bf16/ratio/max"] == pytest.approx(1.0)
    assert got["eval/gap/bf16/long/seq_abs_log_ratio"] == pytest.approx((0.06 + 0.5) / 2)
    assert got["eval/gap/bf16/short/seq_abs_log_ratio"] == pytest.approx((0.3 + 0.05 + 0.1) / 3)


def test_nonfinite_tokens_are_left_out():
    train, policy = as_logprobs([[0.1, 0.2], [0.3], [0.4]])
    policy[0][1] = -math.inf  # a token the policy gave no probability
    got = gap_values(train, policy, "g")
    assert got["g/ratio/max"] == pytest.approx(math.expm1(0.4)) and got[
        "g/short/seq_abs_log_ratio"
    ] == pytest.approx(0.3)
    assert got["g/long/seq_abs_log_ratio"] == pytest.approx(0.1)


@dataclass
class Lengths:
    lengths: list[int]

    def __len__(self) -> int:
        return len(self.lengths)


def test_the_cap_keeps_every_kth_nonempty_response():
    batch = Lengths([3, 0, 4, 5, 6, 7, 8, 9, 10, 11, 12])  # ten non-empty responses
    assert scored_rows(batch, None) == [0, *range(2, 11)]
    assert scored_rows(batch, 10) == [0, *range(2, 11)]
    assert scored_rows(batch, 4) == [0, 4, 7, 10]  # k = ceil(10 / 4) = 3


def test_gap_policies_are_validated_and_default_on():
    assert EvalStage.model_validate({"name": "eval", "kind": "eval"}).gap_policies == ["bf16", "fp32-islands"]
    with pytest.raises(ValueError, match="gap_policies: unknown precision preset"):
        EvalStage.model_validate({"name": "eval", "gap_policies": ["bf8"]})
    with pytest.raises(ValueError, match="gap_policies: each preset may be listed once"):
        EvalStage.model_validate({"name": "eval", "gap_policies": ["bf16", "bf16"]})


# --- the stage on a micro checkpoint
# ----------------------------------------------------------------------------

EVAL = {
    "name": "eval",
    "kind": "eval",
    "prompts": 4,
    "k": 3,
    "sampling": {"max_new_tokens": 24},
    "gap_policies": ["fp32", "bf16", "fp32-islands"],
}


def offset_logits_model(cfg) -> HybridLM:
    """A micro model whose logits all carry a large common offset (about 90): softmax ignores it, but a bf16
    LM head rounds each logit at that magnitude (spacing 0.5), while FP32 islands compute it exactly.

    Every weight is made bf16-exact first, so the copies under each policy hold the trainer's very
    weights and only the activations' precision differs.
    """
    torch.manual_seed(0)
    model = HybridLM(cfg.model, cfg.precision.train)
    with torch.no_grad():
        model.word_embeddings.weight[:, 0] = (
            1.0  # residual channel 0 dominates: the final norm puts ~sqrt(D) there
        )
        model.lm_head.weight[:, 0] += 16.0
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    return model.eval()


def test_eval_reports_the_gap_per_policy_and_length_third(tmp_path):
    cfg = run_config(tmp_path, [EVAL])
    store = open_store(cfg.storage.root)
    torch.manual_seed(1)
    plain = save_model(store, "plain", HybridLM(cfg.model, PrecisionPolicy.preset("fp32")).eval())
    offset = save_model(store, "offset", offset_logits_model(cfg))
    outcome = evaluate.run(
        context(cfg), EvalStage.model_validate(EVAL), StageInputs(init_uri=offset, compare={"plain": plain})
    )
    rows = {r["checkpoint"]: r["values"] for r in outcome.extra["comparison"]["rows"]}
    for values in rows.values():
        for policy in EVAL["gap_policies"]:
            for part in ("", *(f"{t}/" for t in THIRDS)):
                for stat in STATS:
                    assert f"eval/gap/{policy}/{part}{stat}" in values, (policy, part, stat)
        # the negative control: the trainer's own policy, scored the same way, is bitwise the trainer
        assert all(v == 0.0 for k, v in values.items() if k.startswith("eval/gap/fp32/"))
        assert "eval/ratio/p99" in values  # the engine-vs-trainer tail stays
    got = rows["input"]
    bf16, islands = got["eval/gap/bf16/ratio/p99"], got["eval/gap/fp32-islands/ratio/p99"]
    assert bf16 > 10 * islands > 0  # measured: ~0.15 vs ~2e-4
    assert got["eval/gap/bf16/ratio/max"] >= bf16 and got["eval/gap/bf16/long/seq_abs_log_ratio"] > 0
    s = outcome.summary  # other checkpoints under compare/<name>/, without eval/
    assert s["eval/gap/bf16/ratio/p99"] == bf16
    assert s["compare/plain/gap/bf16/long/ratio/p99"] == rows["plain"]["eval/gap/bf16/long/ratio/p99"]


def test_no_gap_policies_no_gap_keys(tmp_path):
    stage = EvalStage.model_validate({**EVAL, "gap_policies": []})
    cfg = run_config(tmp_path, [stage.model_dump()])
    store = open_store(cfg.storage.root)
    uri = save_model(store, "plain", HybridLM(cfg.model, PrecisionPolicy.preset("fp32")).eval())
    task, tokenizer = evaluate.task_and_tokenizer(cfg)
    values = evaluate.measure_checkpoint(cfg, store, uri, stage, task, tokenizer, task.prompts("eval", 4), [])
    assert not [k for k in values if k.startswith("eval/gap/")] and "eval/ratio/p99" in values
