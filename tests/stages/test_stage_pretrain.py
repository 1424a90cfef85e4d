"""The pretrain stage through the local pipeline runner: output, summary, metrics, caching and resume."""

import math

import pytest
import torch
from stage_kit import run_config, state_equal

import ringzero.stages.pretrain as pretrain_runner
from ringzero.engines.builders import start_model
from ringzero.model.checkpoint import load_model
from ringzero.model.config import PrecisionPolicy
from ringzero.model.tolerances import compare
from ringzero.pipeline.local import run_pipeline
from ringzero.stages.corpus_windows import CorpusWindows
from ringzero.store import open_store
from ringzero.tokenizer import CharTokenizer

FP32_POLICY = PrecisionPolicy.preset("fp32")  # compare resumed weights exactly, not after a bf16 cast
BASE = {
    "name": "base",
    "kind": "pretrain",
    "steps": 6,
    "batch_size": 2,
    "seq_len": 32,
    "checkpoint_every": 3,
    "optim": {"lr": 3e-3, "warmup_steps": 2},
}


def pipeline(root):
    cfg = run_config(root, [BASE])
    return cfg, run_pipeline(cfg, open_store(cfg.storage.root), root / "run")


def recorded_losses(monkeypatch) -> list[tuple[bool, float]]:
    """Every ``lm_step`` the pretrain runner makes, as (trained, loss): the stage's own numbers, step by
    step."""
    calls = []
    original = pretrain_runner.lm_step

    def recording(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append((kwargs.get("optimizer") is not None, result.loss))
        return result

    monkeypatch.setattr(pretrain_runner, "lm_step", recording)
    return calls


def moved(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The tensors of ``a`` outside the fp32 tolerance of ``b``'s."""
    return [k for k in a if not compare(a[k], b[k], torch.float32)["ok"]]


def test_pretrain_stage_through_the_pipeline(tmp_path, monkeypatch):
    calls = recorded_losses(monkeypatch)
    cfg, result = pipeline(tmp_path)
    assert result.status == "succeeded"
    ex = result.stages[0]
    assert ex.outcome.stop_reason == "steps" and ex.outcome.steps == 6
    loaded = load_model(ex.outcome.output_uri)
    assert loaded.config == cfg.model
    summary = ex.outcome.summary
    for key in (
        "train/loss",
        "eval/accuracy",
        "eval/greedy_accuracy",
        "eval/forced_trace_accuracy",
        "trace/rate",
        "len/mean",
    ):
        assert key in summary, key
    assert 0.0 <= summary["trace/rate"] <= 1.0 and summary["len/mean"] >= 1.0
    records = ex.metrics
    assert records and {"train/loss", "train/lr", "train/tokens_per_s"} <= set(records[-1])
    assert records[-1]["step"] == 6
    # Pretraining learns: the first step's loss is the untrained model's (about ln 64 for uniform next
    # tokens over the 64 ids); after 6 steps the held-out loss on an unseen batch is clearly lower.
    trained = [loss for is_step, loss in calls if is_step]
    assert len(trained) == 6 and [is_step for is_step, _ in calls][-1] is False
    assert abs(trained[0] - math.log(cfg.model.vocab_size)) < 0.1, trained
    assert summary["train/loss"] < trained[0] - 0.2, (summary["train/loss"], trained)
    assert records[-1]["train/loss"] < trained[0] - 0.1, (records[-1], trained)
    again = run_pipeline(cfg, open_store(cfg.storage.root), tmp_path / "run")
    assert again.stages[0].skipped and again.stages[0].outcome.output_uri == ex.outcome.output_uri


def test_windows_open_with_bos_and_a_document_and_depend_only_on_seed_and_step(tmp_path):
    cfg = run_config(tmp_path, [BASE])
    from ringzero.tasks import make_task

    tok = CharTokenizer()
    windows = CorpusWindows(make_task(cfg.task), tok, 64, seed=0)
    batch = windows.batch(5, 4)
    assert batch.shape == (4, 65) and (batch[:, 0] == tok.bos_id).all()
    texts = [tok.decode(row) for row in batch.tolist()]
    assert all(t.startswith(("q: ", "facts: ")) or t[0].isalpha() for t in texts)
    assert (windows.batch(5, 4) == batch).all() and not (windows.batch(6, 4) == batch).all()


def test_interrupted_pretrain_resumes_with_its_optimizer_state(tmp_path, monkeypatch):
    cfg, whole = pipeline(tmp_path / "whole")
    original = CorpusWindows.batch

    def dies_at_step_5(self, step, batch_size):
        if step == 4:  # 0-based; the resume point after step 3 is committed
            raise KeyboardInterrupt("preempted")
        return original(self, step, batch_size)

    monkeypatch.setattr(CorpusWindows, "batch", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        pipeline(tmp_path / "cut")
    seen = []

    def records_steps(self, step, batch_size):
        seen.append(step)
        return original(self, step, batch_size)

    monkeypatch.setattr(CorpusWindows, "batch", records_steps)
    cut_cfg, resumed = pipeline(tmp_path / "cut")
    ex = resumed.stages[0]
    assert not ex.skipped and ex.outcome.steps == 6
    assert seen == [3, 4, 5, 6]  # steps 4-6 (0-based 3-5) after the resume point, then the unseen loss batch
    a = load_model(whole.stages[0].outcome.output_uri, FP32_POLICY).model.state_dict()
    b = load_model(ex.outcome.output_uri, FP32_POLICY).model.state_dict()
    assert state_equal(a, b)  # weights, Adam moments and the schedule all came back
    # Equal because both trained, not because neither did: the weights left the stage's initial ones,
    # and the resume point the rerun started from holds step 3's weights, between the two.
    initial = start_model(cfg, open_store(cfg.storage.root), None, FP32_POLICY).state_dict()
    assert initial.keys() == a.keys()
    assert moved(a, initial), "six pretrain steps left every weight where it started"
    store = open_store(cut_cfg.storage.root)
    (point,) = [u for u in store.list("stages") if store.name_of(u).endswith("/step-000003")]
    saved = store.load(point)
    assert saved.meta["step"] == 3
    mid = {k[len("model.") :]: v for k, v in saved.tensors.items() if k.startswith("model.")}
    assert mid.keys() == a.keys() and moved(mid, initial) and moved(a, mid)
