"""Whether the SGLang release the rollout image pins would load and serve a model config correctly.

Read from that release's ``python/sglang/srt/models/bailing_moe_linear.py`` (``BailingMoeV2_5ForCausalLM``),
so the rules follow ``SGLANG_VERSION``, which a test keeps equal to the rollout image's pin. For 0.5.23:

- ``BailingMoELinearModel`` asserts ``num_hidden_layers % layer_group_size == 0`` and places MLA at
  ``(i + 1) % layer_group_size == 0``: the layout must be the reference one built from the group size.
- ``tie_word_embeddings: true`` makes ``lm_head = self.word_embeddings`` on the causal-LM class, which has
  no such attribute (the embedding is ``self.model.word_embeddings``): an AttributeError at load.
- ``num_shared_experts: null`` reaches ``if self.num_shared_experts > 0`` in the MoE block (a TypeError):
  ``hf_config`` writes ``0`` for it, which means the same (no shared experts), so it is not a problem here.
- The earlier rule that MLA layers sit at indices 7, 15, ... 79 (a ``layer_group_size`` of 8) is gone: the
  weight mapper that lists those indices applies to quantization configs only, and ``load_weights``
  renames ``.dense.`` to ``.o_proj.`` at every MLA layer.
"""

from __future__ import annotations

from ringzero.model.config import ModelConfig

SGLANG_VERSION = "0.5.23"
"""The SGLang release these rules were read from: the rollout image's ``lmsysorg/sglang`` tag."""


def sglang_problems(cfg: ModelConfig, version: str = SGLANG_VERSION) -> list[str]:
    """Why SGLang ``version``'s ``BailingMoeV2_5ForCausalLM`` would not serve this model correctly (empty: it
    would). A version whose loader these rules were not read from is a problem in itself."""
    if version != SGLANG_VERSION:
        return [
            f"SGLang {version}: ringzero's loadability rules were read from SGLang {SGLANG_VERSION}'s loader "
            "(ringzero/model/sglang_loader.py); check that release's bailing_moe_linear.py and update them"
        ]
    problems = []
    if not cfg.reference_layout():
        problems.append(
            f"layout {cfg.layout!r} is not built from layer_group_size: SGLang places MLA at every "
            "layer_group_size-th layer"
        )
    if cfg.num_hidden_layers % cfg.layer_group_size:
        problems.append(
            f"num_hidden_layers ({cfg.num_hidden_layers}) must be a multiple of layer_group_size "
            f"({cfg.layer_group_size}): SGLang asserts it"
        )
    if cfg.tie_word_embeddings:
        problems.append(
            "tie_word_embeddings: true: SGLang's BailingMoeV2_5ForCausalLM ties the LM head to "
            "self.word_embeddings, which the causal-LM class does not have (AttributeError at load); "
            "train with tie_word_embeddings: false"
        )
    return problems
