"""One RL step (sampling, rewards, minibatch updates, weight push) lives on the stage's device.

Checked without a GPU: the model, its rollout engine and the trainer run on ``meta``, inside the
device trap (``tests/device_trap.py``), which fails on any tensor made on, or used from, the host.
Only the optimizer is a stand-in: torch's AdamW keeps its step counters as host scalars by design.
"""

from __future__ import annotations

import math

import pytest
import torch
from device_trap import device_trap

import ringzero.rl.policy_scores as scores_module
from ringzero.config.loader import parse_config
from ringzero.engines.builders import task_and_tokenizer
from ringzero.engines.optimizer import StepReport
from ringzero.model.hybrid import HybridLM
from ringzero.parallel.runtime import single
from ringzero.rl.rewards import TaskReward
from ringzero.rl.step import PushingRollout, RLStep, StepShape
from ringzero.rl.trainer import PolicyTrainer
from ringzero.rollout.engine.embedded import EmbeddedEngine

META = torch.device("meta")


class RecordingOptimizer:
    def __init__(self, model):
        self.model, self.steps = model, 0

    def zero_grad(self):
        for p in self.model.parameters():
            p.grad = None

    def step(self):
        self.steps += 1
        assert all(p.grad is None or p.grad.device == META for p in self.model.parameters())
        return StepReport(lr=1e-4, grad_norm=0.0, skipped=False)


def _step_on_meta(kl_coef: float = 0.0):
    cfg = parse_config(
        {
            "run": {"name": "trap", "device": "cpu"},
            "model": {
                "vocab_size": 64,
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "layout": "LM",
                "kv_lora_rank": 12,
                "qk_nope_head_dim": 8,
                "qk_rope_head_dim": 4,
                "v_head_dim": 8,
                "head_dim": 8,
                "lightning_block_size": 8,
                "intermediate_size": 48,
                "max_position_embeddings": 64,
            },
            "precision": {"train": "fp32-islands", "rollout": "fp32-islands"},
            "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 2},
            "stages": [
                {
                    "name": "rl",
                    "kind": "rl",
                    "prompts_per_step": 2,
                    "samples_per_prompt": 2,
                    "minibatches": 2,
                    "micro_batch": 1,
                    "sampling": {"max_new_tokens": 6},
                    "loss": {"kind": "sg_clip_is", "normalization": "sample_mean", "kl_coef": kl_coef},
                }
            ],
        }
    )
    stage = cfg.stages[0]
    task, tokenizer = task_and_tokenizer(cfg)
    model = HybridLM(cfg.model, cfg.precision.train).to(META).train()
    reference = HybridLM(cfg.model, cfg.precision.train).to(META).eval() if kl_coef else None
    engine = EmbeddedEngine(model, tokenizer, cfg.precision.rollout, max_batch=8, seed=0)
    optimizer = RecordingOptimizer(model)
    trainer = PolicyTrainer(
        model,
        optimizer,
        stage.loss,
        minibatches=stage.minibatches,
        max_new_tokens=stage.sampling.max_new_tokens,
        temperature=1.0,
        reference=reference,
        pad_id=tokenizer.pad_id,
        runtime=single(META),
        micro_batch=stage.micro_batch,
    )
    pushed = []
    stepper = RLStep(
        rollout=PushingRollout(
            engine, lambda step: pushed.append(engine.update_weights(model.state_dict(), "v1"))
        ),
        trainer=trainer,
        task=task,
        tokenizer=tokenizer,
        reward=TaskReward(task),
        sampling=stage.sampling,
        shape=StepShape(stage.prompts_per_step, stage.samples_per_prompt),
        seed=0,
    )
    return stepper, optimizer, pushed


@pytest.mark.parametrize("kl_coef", [0.0, 0.01])
def test_one_rl_step_makes_no_host_tensor(kl_coef):
    stepper, optimizer, pushed = _step_on_meta(kl_coef)
    with device_trap(META) as trap:
        metrics = stepper.run(0)
    # Both minibatches ran to their update (on meta a finiteness check reads False, so it may count as
    # skipped: the trap's stand-in reads return zeros), and the weights were pushed.
    assert optimizer.steps + metrics["loss/skipped"] == 2 and len(pushed) == 1
    assert trap.ops["torch.Tensor.backward"] >= 4  # one backward per micro-batch of one row
    assert "ratio/p99" in metrics and math.isfinite(metrics["time/step"])


def test_the_trap_sees_a_host_tensor_in_the_training_step(monkeypatch):
    stepper, _, _ = _step_on_meta()
    real = scores_module.response_view

    def leaky(grid_mW, prompt_lens_m, T):
        return real(grid_mW, prompt_lens_m, T) + torch.zeros(T)  # a host tensor joins the device path

    monkeypatch.setattr(scores_module, "response_view", leaky)
    with pytest.raises(AssertionError, match="cpu"), device_trap(META):
        stepper.run(0)
