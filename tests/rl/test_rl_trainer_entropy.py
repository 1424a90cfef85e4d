"""Batch-invariant scoring with entropy: one forward per row, whose logits give both the log-probs (bit for
bit those scored without entropy) and the entropy (bit for bit that of the same logits)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ringzero.config.stages import LossSettings
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.logprobs import entropy
from ringzero.model.scoring import bitwise_hidden, bitwise_ids
from ringzero.rl.trainer import PolicyTrainer

MICRO = dict(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    layout="LM",
    intermediate_size=48,
    max_position_embeddings=48,
    kv_lora_rank=8,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=6,
    head_dim=8,
    lightning_block_size=4,
)
T = 24


def _parts():
    model = HybridLM(ModelConfig.model_validate(MICRO), PrecisionPolicy.preset("fp32"))
    model.reset_parameters(torch.Generator().manual_seed(0))
    seqs = [[3 + (i * 7 + j) % 60 for j in range(20 + 4 * i)] for i in range(3)]
    plens = [6, 9, 12]
    batch = SimpleNamespace(sequences=lambda rows: ([seqs[r] for r in rows], [plens[r] for r in rows]))
    trainer = PolicyTrainer(
        model,
        None,
        LossSettings(),
        minibatches=1,
        max_new_tokens=T,
        temperature=0.7,
        batch_invariant=True,
        micro_batch=16,
    )
    return model, trainer, batch, seqs, plens


def test_entropy_comes_from_the_scoring_forward_and_leaves_the_logprobs_alone(monkeypatch):
    model, trainer, batch, seqs, plens = _parts()
    plain, _, none = trainer.score(model, batch, [0, 1, 2], T)
    forwards = []
    hidden = model.hidden
    monkeypatch.setattr(model, "hidden", lambda *a, **kw: forwards.append(1) or hidden(*a, **kw))
    logp, owned, ent = trainer.score(model, batch, [0, 1, 2], T, with_entropy=True)
    assert none is None and len(forwards) == 3  # one forward per row, no second one for the entropy
    assert torch.equal(logp, plain) and owned.all()
    monkeypatch.undo()
    padded_forward = PolicyTrainer(
        model, None, LossSettings(), minibatches=1, max_new_tokens=T, temperature=0.7, micro_batch=16
    )
    with torch.no_grad():
        for i, (seq, plen) in enumerate(zip(seqs, plens, strict=True)):
            logits = model.logits(bitwise_hidden(model, bitwise_ids(model, seq)))
            want = entropy(logits, 0.7)[0, plen - 1 : len(seq) - 1]
            assert torch.equal(ent[i, : len(want)], want) and not ent[i, len(want) :].any()
            # The padded forward the entropy used to come from agrees to rounding.
            old = padded_forward.score(model, batch, [i], T, with_entropy=True)[2][0]
            torch.testing.assert_close(ent[i], old, rtol=1e-5, atol=1e-5)
