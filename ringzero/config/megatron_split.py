"""The one rule set for how the megatron engine splits a model over ``tp x pp x ep x cp`` ranks.

Config validation (``config.run.megatron_problems``, every problem at load), the cost planner
(``ringzero.cost.plan``, a refused layout's reasons) and the engine's build (``engines.megatron.model``,
before megatron allocates anything) all call ``split_problems``; each problem names the config field it
is about. The expert-parallel degree's own rule (``ep`` divides ``dp x cp``) is
``parallel.config.ep_problem``, which ``ParallelDims`` enforces for any job.
"""

from __future__ import annotations

from ringzero.model.config import ModelConfig
from ringzero.parallel.config import ep_problem


def split_problems(
    m: ModelConfig, *, tp: int, pp: int = 1, ep: int = 1, cp: int = 1, dp: int | None = None
) -> list[str]:
    """Every way ``m`` cannot be split at this layout (``dp``: check ``ep`` against ``dp x cp`` too)."""
    problems = []
    if m.num_experts is not None:
        problems += _moe_problems(m, tp, ep)
    elif ep > 1:
        problems.append(
            f"engines.training.ep: {ep}: the model has no MoE layers (model.num_experts is null), so there "
            "are no experts to split; use ep: 1"
        )
    if dp is not None and (problem := ep_problem(ep, dp, cp)):
        problems.append(f"engines.training.ep: {problem}")
    if pp > 1 and m.num_hidden_layers % pp:
        problems.append(
            f"engines.training.pp: {pp} does not divide model.num_hidden_layers ({m.num_hidden_layers}): "
            "each pipeline stage holds an equal run of layers"
        )
    if pp > 1 and m.tie_word_embeddings:
        problems.append(
            f"engines.training.pp: {pp} with model.tie_word_embeddings: the LM head would sit on the last "
            "stage and its weight, the embedding, on the first; use untied embeddings (Ling 2.5's)"
        )
    for name, size, why in (
        ("model.num_attention_heads", m.num_attention_heads, "each rank holds whole heads"),
        ("model.vocab_size", m.vocab_size, "the embedding and LM head split the vocabulary rows evenly"),
        (
            "model.group_norm_size",
            m.group_norm_size,
            "each rank normalizes whole groups of the Lightning output",
        ),
    ):
        if size % tp:
            problems.append(f"engines.training.tp: {tp} does not divide {name} ({size}): {why}")
    heads = m.num_attention_heads // tp
    if cp > 1 and m.num_attention_heads % tp == 0 and "mla" in m.layer_types() and heads % cp:
        problems.append(
            f"parallel.cp: {cp} does not divide the {heads} heads of each tensor-parallel rank "
            "(model.num_attention_heads / engines.training.tp): MLA's all-to-all gives each CP rank "
            "whole heads"
        )
    return problems


def _moe_problems(m: ModelConfig, tp: int, ep: int) -> list[str]:
    """What megatron's MoELayer cannot express of ringzero's MoE, or cannot split."""
    problems = []
    if not m.norm_topk_prob and m.num_experts_per_tok > 1:
        problems.append(
            "engines.training.kind megatron: model.norm_topk_prob is false; megatron's sigmoid router "
            "always renormalizes the weights of the chosen experts"
        )
    if m.n_group > 1 and m.num_experts_per_tok // m.topk_group != 2:
        problems.append(
            f"engines.training.kind megatron: model.num_experts_per_tok // model.topk_group is "
            f"{m.num_experts_per_tok // m.topk_group}; megatron scores an expert group by its top "
            "num_experts_per_tok // topk_group experts, ringzero by its top 2, so it must be 2"
        )
    shared = (m.num_shared_experts or 0) * m.moe_intermediate_size
    for name, width in (
        ("model.moe_intermediate_size", m.moe_intermediate_size),
        ("model.num_shared_experts x moe_intermediate_size", shared),
    ):
        if width % tp:
            problems.append(
                f"engines.training.tp: {tp} does not divide {name} ({width}): each rank holds an "
                "equal share of every expert's columns"
            )
    if m.num_experts % ep:
        problems.append(
            f"engines.training.ep: {ep} does not divide model.num_experts ({m.num_experts}): each "
            "expert-parallel rank holds an equal share of the routed experts"
        )
    return problems
