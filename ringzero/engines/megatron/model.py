"""``MegatronLM``: ringzero's Ling 2.5 model built from megatron-core modules, with tensor parallelism.

Build it after the caller has run ``megatron.core.parallel_state.initialize_model_parallel(...)``: the
model reads its TP group from that global state once, at build time (``tp_rank``/``tp_size`` are kept),
and never after. The caller also seeds megatron's RNG tracker (``tensor_parallel.random.
model_parallel_cuda_manual_seed``) before the first forward: its attention forks that tracker even with
dropout off. Pieces, named so that ``convert`` maps them to ``HybridLM``'s names:
- ``word_embeddings``: ``VocabParallelEmbedding`` (vocabulary rows split over TP);
- ``decoder``: a ``TransformerBlock`` with one layer spec per layer in ``ModelConfig.layer_types()``:
  MLA layers are megatron's ``MLASelfAttention`` (local spec, ``rope_type="rope"``, latent norms), the
  Lightning layers ``LightningSelfAttention``; each with the local spec's pre-norms and a dense SwiGLU
  MLP (``linear_fc1`` = gate | up, split with TP stride 2), or from ``first_k_dense_replace`` on (when
  ``num_experts`` is set) ``MoE``: megatron's ``MoELayer`` (see below);
- ``norm``: the final RMSNorm (ringzero's: it can hand the LM-head island fp32 output);
- ``output_layer``: a column-parallel head whose logits are gathered to the full vocabulary, in fp32
  when ``policy.lm_head_fp32``; absent with ``tie_word_embeddings`` (the embedding's shard is its weight).

The training contract is ``HybridLM``'s: ``hidden(input_ids_BS, positions_BS=None) -> [B, S, D]``,
``logits(hidden_BSD) -> [B, S, V]``, ``forward(ids, positions=None) -> logits``; batch-first in and out,
megatron's ``[S, B, D]`` inside. megatron's MLA ropes the positions of its own layout: ``0..S-1``, or
under context parallelism (``cp`` > 1 in megatron's parallel state) this rank's two zigzag chunks of the
global sequence (``sharding: zigzag``); ``positions`` must be those (right padding marked negative is
accepted: causal layers never let it reach a real token). They travel through the decoder as megatron's
``attention_mask`` argument, from which the MLA core (``attention.MLACoreAttention``) and the Lightning
layer build their visibility.

Precision: parameters and activations in ``policy.body``; MLA's softmax island is ringzero's (q, k, v in
fp32 before the scores, ``policy.attention_softmax_fp32``), the Lightning state stays fp32 as in ringzero.

Context parallelism: MLA layers all-to-all their heads (``attention``), Lightning layers all-gather their
chunk states (``lightning``); everything else is per token. With expert parallelism megatron folds the CP
ranks into its expert groups (``ParallelDims.ep_index``); MoE is per token, so that needs nothing here.
Not implemented: sequence parallelism outside the MoE layers.

Pipeline parallelism (``pipeline_model_parallel_size`` > 1 in megatron's parallel state): this rank's
stage holds ``num_hidden_layers / pp`` consecutive layers (``stage``: a ``convert.StageLayers``, built with
their global layer numbers, so Lightning's decay slopes are the whole model's), the embedding only on the
first stage, the final norm and the head only on the last. Such a model is not called as one function:
``pipeline`` (``ringzero.engines.megatron.pipeline.Pipeline``) runs megatron's 1F1B schedule over a list
of micro-batches (``ringzero.parallel.micro_batches``), ``stage_forward`` is one stage's part of a
forward, and ``hidden``/``forward`` refuse. Tied embeddings are refused at pp > 1 (the head would live on
another stage than the embedding it shares).

MoE layers are ``ringzero.model.moe``'s math in megatron's ``MoELayer``: local ``SequentialMLP`` experts,
the allgather token dispatcher, a ``TopKRouter`` in fp32 with the sigmoid score, the routing-only expert
bias (buffer ``router.expert_bias``; its update rate is 0: ringzero never trains it), grouped top-k,
renormalized weights times ``routed_scaling_factor``, and the shared experts as one MLP. megatron cannot
express ``norm_topk_prob: false`` with more than one expert per token (it always renormalizes) nor a
group score other than the sum of the top ``num_experts_per_tok // topk_group`` experts (ringzero's is
the top 2): those are refused. Experts are split over TP like dense MLPs (expert TP = TP). With expert
parallelism (``expert_model_parallel_size`` > 1 in megatron's parallel state) EP rank ``r`` holds the
routed experts ``r * E / ep .. (r + 1) * E / ep - 1`` as its local experts ``0 ..``; the allgather
dispatcher gathers every EP rank's tokens, each rank runs its own experts and the outputs are
reduce-scattered back, so the ranks of an EP group must give the layer the same number of tokens: ``MoE``
pads each rank's tokens to the most of any rank of its EP group (zero rows: their outputs are dropped and
they contribute nothing to any gradient). Expert weights carry megatron's ``allreduce = False``: their
gradients are summed over the expert-data-parallel group only (``optimizer``).
megatron's MoE at TP > 1 assumes sequence parallelism (each rank routes its slice of the tokens; the
dispatcher gathers them over TP), which the rest of this model does not use: ``MoE`` flattens the
``[S, B]`` tokens, pads them to a multiple of TP, gives each rank its slice, and gathers the outputs
back; the router weight, replicated, has its gradient summed over TP (each rank saw its slice only).

Letter legend: B batch, S sequence, D hidden_size, V vocab, N tokens (S * B, padded to P).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    set_tensor_model_parallel_attributes,
)
from megatron.core.tensor_parallel.mappings import (
    gather_from_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.moe_utils import router_gating_linear
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlock, TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import MLATransformerConfig

from ringzero.config.megatron_split import split_problems
from ringzero.engines.megatron import cpu_shim
from ringzero.engines.megatron.attention import MLACoreAttention
from ringzero.engines.megatron.convert import SPLITS, StageLayers
from ringzero.engines.megatron.lightning import LightningSelfAttention
from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.norms import RMSNorm
from ringzero.model.precision import at_least_fp32, body_dtype
from ringzero.parallel.comm import CommLedger
from ringzero.parallel.sharding import position_list


def moe_settings(cfg: ModelConfig) -> dict:
    """megatron's MoE fields for ``cfg`` (none for a dense model): ringzero's router, see the docstring."""
    if cfg.num_experts is None:
        return {}
    grouped = cfg.n_group > 1
    shared = (cfg.num_shared_experts or 0) * cfg.moe_intermediate_size
    return dict(
        num_moe_experts=cfg.num_experts,
        moe_ffn_hidden_size=cfg.moe_intermediate_size,
        moe_router_topk=cfg.num_experts_per_tok,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=cfg.moe_router_enable_expert_bias,
        moe_router_bias_update_rate=0.0,
        moe_router_num_groups=cfg.n_group if grouped else None,
        moe_router_group_topk=cfg.topk_group if grouped else None,
        moe_router_topk_scaling_factor=cfg.routed_scaling_factor,
        moe_router_dtype="fp32",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_z_loss_coeff=None,
        moe_shared_expert_intermediate_size=shared or None,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather",
    )


def transformer_config(
    cfg: ModelConfig,
    policy: PrecisionPolicy,
    tp_size: int,
    ep_size: int = 1,
    cp_size: int = 1,
    pp_size: int = 1,
    on_gpu: bool = False,
) -> MLATransformerConfig:
    """megatron's config for ``cfg``: dropout off, no biases, shards allocated on the CPU, not drawn. Under
    pipeline parallelism the stages send activations in the body dtype, each micro-batch with its own
    shape (``variable_seq_lengths``: rows are right-padded per micro-batch), and the schedule neither
    divides nor scales the loss (``calculate_per_token_loss``: ringzero's losses carry their global
    denominator)."""
    dtype = body_dtype(policy)
    pipeline = (
        dict(
            pipeline_model_parallel_size=pp_size,
            pipeline_dtype=dtype,
            calculate_per_token_loss=True,
            batch_p2p_comm=False,
        )
        if pp_size > 1
        else {}
    )
    config = MLATransformerConfig(
        **moe_settings(cfg),
        **pipeline,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_head_dim=cfg.qk_nope_head_dim,
        qk_pos_emb_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        rope_type="rope",
        rotary_base=cfg.rope_theta,
        rotary_scaling_factor=1.0,
        qk_layernorm=True,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        # weights are always loaded after the build (a checkpoint, or a fresh HybridLM's for parity with the
        # torch engine): each rank allocates its shards only, on its GPU when it has one, and draws nothing
        init_method_std=cfg.initializer_range,
        use_cpu_initialization=not on_gpu,
        perform_initialization=False,
        tensor_model_parallel_size=tp_size,
        expert_model_parallel_size=ep_size,
        context_parallel_size=cp_size,
        sequence_parallel=False,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        attention_softmax_in_fp32=policy.attention_softmax_fp32,
    )
    return config


class Router(TopKRouter):
    """megatron's top-k router whose weight gradient is summed over TP when each rank routes a slice of
    the tokens (``MoE`` at TP > 1); at TP = 1 it is ``TopKRouter``."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if parallel_state.get_tensor_model_parallel_world_size() > 1:
            weight = cpu_shim.AllReduceGrad.apply(weight, parallel_state.get_tensor_model_parallel_group())
        return router_gating_linear(input, weight, self.bias, torch.float32)


class MoE(MoELayer):
    """megatron's ``MoELayer`` on a model without sequence parallelism: ``[S, B, D]`` in and out, whole on
    every TP rank. At TP > 1 the layer runs with a sequence-parallel config on this rank's slice of the
    tokens, at EP > 1 on as many tokens as every rank of its EP group (see the module docstring); at
    TP = EP = 1 it is ``MoELayer``."""

    def __init__(self, config, submodules=None, layer_number=None, pg_collection=None):
        self.tp = config.tensor_model_parallel_size
        self.ep = config.expert_model_parallel_size
        if self.tp > 1:
            config = dataclasses.replace(config, sequence_parallel=True)
        super().__init__(config, submodules, layer_number, pg_collection)

    def _most_tokens(self, n: int) -> int:
        """The most tokens any rank of this rank's EP group has (the dispatcher gathers equal shares)."""
        if self.ep == 1:
            return n
        count = torch.tensor([n])
        torch.distributed.all_reduce(
            count, op=torch.distributed.ReduceOp.MAX, group=parallel_state.get_expert_model_parallel_group()
        )
        return int(count.item())

    def forward(self, hidden_states, intermediate_tensors=None, padding_mask=None):
        if self.tp == 1 and self.ep == 1:
            return super().forward(hidden_states, padding_mask=padding_mask)
        S, B, D = hidden_states.shape
        N = S * B
        P = -(-self._most_tokens(N) // self.tp) * self.tp
        # zero rows pad the tokens to whole slices; their outputs are dropped, so they get no gradient
        x_P1D = F.pad(hidden_states.reshape(N, 1, D), (0, 0, 0, 0, 0, P - N))
        if self.tp == 1:
            out_P1D, bias = super().forward(x_P1D)
            return out_P1D[:N].reshape(S, B, D), bias
        out, bias = super().forward(scatter_to_sequence_parallel_region(x_P1D))
        # the output's gradient is whole on every rank: the backward takes this rank's slice, no sum
        out_P1D = gather_from_sequence_parallel_region(out, tensor_parallel_output_grad=False)
        return out_P1D[:N].reshape(S, B, D), bias


def moe_spec(cfg: ModelConfig) -> ModuleSpec:
    spec = get_gpt_layer_local_spec(num_experts=cfg.num_experts, moe_grouped_gemm=False).submodules.mlp
    spec.module = MoE
    spec.submodules.router = Router
    return spec


def layer_specs(cfg: ModelConfig, policy: PrecisionPolicy, ledger: CommLedger) -> list[ModuleSpec]:
    """One ``TransformerLayer`` spec per layer, MLA or Lightning as ``cfg.layer_types()`` says, with a
    dense MLP or (``cfg.is_moe_layer``) ``MoE``; the CP collectives book into ``ledger``."""
    specs = []
    for i, kind in enumerate(cfg.layer_types()):
        spec = get_gpt_layer_local_spec(
            multi_latent_attention=kind == "mla", qk_layernorm=True, normalization="RMSNorm"
        )
        if cfg.is_moe_layer(i):
            spec.submodules.mlp = moe_spec(cfg)
        if kind == "mla":
            spec.submodules.self_attention.submodules.core_attention = ModuleSpec(
                module=MLACoreAttention,
                params={
                    "impl": cfg.mla_attention_impl,
                    "ledger": ledger,
                    "softmax_fp32": policy.attention_softmax_fp32,
                },
            )
        else:
            spec.submodules.self_attention = ModuleSpec(
                module=LightningSelfAttention,
                params={"model_config": cfg, "policy": policy, "ledger": ledger},
            )
        specs.append(spec)
    return specs


def _refusals(cfg: ModelConfig, tp: int, ep: int, pp: int, cp: int) -> list[str]:
    """The split rules config validation applies too (``config.megatron_split``), and the one this engine's
    megatron state must meet: experts split over TP like dense MLPs."""
    problems = split_problems(cfg, tp=tp, pp=pp, ep=ep, cp=cp)
    expert_tp = parallel_state.get_expert_tensor_parallel_world_size()
    if cfg.num_experts is not None and expert_tp != tp:
        problems.append(
            f"expert tensor parallel size ({expert_tp}) must equal the tensor-parallel size ({tp}): "
            "experts split like dense MLPs"
        )
    return problems


class MegatronLM(torch.nn.Module):
    """``device``: where megatron allocates its layers' shards (a CUDA device: megatron allocates on
    ``torch.cuda.current_device()``, which the caller makes ``device``: the engine builds under
    ``torch.cuda.device(device)``; on the CPU when None or a CPU device). The few ringzero-built modules
    (final norm) are moved by the caller's ``.to(device)``."""

    def __init__(self, cfg: ModelConfig, policy: PrecisionPolicy, device: torch.device | None = None):
        super().__init__()
        cpu_shim.apply()
        if not parallel_state.model_parallel_is_initialized():
            raise RingzeroError(
                "MegatronLM needs megatron.core.parallel_state.initialize_model_parallel(...) "
                "to have been called first (it reads the tensor-parallel group from it)"
            )
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.ep_size = parallel_state.get_expert_model_parallel_world_size()
        self.ep_rank = parallel_state.get_expert_model_parallel_rank()
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        self.pp_size = parallel_state.get_pipeline_model_parallel_world_size()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        problems = _refusals(cfg, self.tp_size, self.ep_size, self.pp_size, self.cp_size)
        if problems:
            raise RingzeroError("cannot build MegatronLM: " + "; ".join(problems))
        self.cfg, self.policy = cfg, policy
        self.stage = StageLayers.of(cfg.num_hidden_layers, self.pp_rank, self.pp_size)
        on_gpu = device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available()
        self.config = transformer_config(
            cfg, policy, self.tp_size, self.ep_size, self.cp_size, self.pp_size, on_gpu
        )
        self.ledger = CommLedger()
        self.word_embeddings = (
            VocabParallelEmbedding(
                cfg.vocab_size,
                cfg.hidden_size,
                init_method=self.config.init_method,
                config=self.config,
            )
            if self.stage.has_embedding
            else None
        )
        specs = layer_specs(cfg, policy, self.ledger)[self.stage.first : self.stage.first + self.stage.count]
        self.decoder = TransformerBlock(
            self.config,
            TransformerBlockSubmodules(layer_specs=specs),
            post_layer_norm=False,
            pre_process=self.stage.has_embedding,
            post_process=self.stage.has_head,
        )
        self.norm = self.output_layer = None
        if self.stage.has_head:
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps).to(body_dtype(policy))
            head_dtype = at_least_fp32(body_dtype(policy)) if policy.lm_head_fp32 else body_dtype(policy)
            self.output_layer = ColumnParallelLinear(
                cfg.hidden_size,
                cfg.vocab_size,
                config=dataclasses.replace(self.config, params_dtype=head_dtype),
                init_method=self.config.init_method,
                bias=False,
                gather_output=True,
                skip_weight_param_allocation=cfg.tie_word_embeddings,
            )
        self._mark_tensor_parallel()
        self.pipeline = None
        if self.pp_size > 1:
            from megatron.core.enums import ModelType

            from ringzero.engines.megatron.pipeline import Pipeline

            self.model_type = ModelType.encoder_or_decoder  # what megatron's schedule asks of a model
            self.pipeline = Pipeline(self)
            # Set once every module is built (``dataclasses.replace`` re-runs the checks): megatron refuses
            # it with the allgather dispatcher, whose EP ranks must bring equal token counts, but ringzero's
            # ``MoE`` pads every rank to its EP group's most; the flag itself only makes the stages send each
            # activation's shape before it (rows are right-padded per micro-batch).
            self.config.variable_seq_lengths = True

    def _mark_tensor_parallel(self) -> None:
        """The TP attributes megatron's CPU init would have set (``tensor_model_parallel``, ``partition_dim``,
        ``partition_stride``): with ``perform_initialization=False`` its parallel layers skip them (0.16.1),
        and the optimizer's clip norm reads them. Dims and strides are ``convert.SPLITS``'."""
        kinds = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
        for name, module in self.named_modules():
            weight = getattr(module, "weight", None)
            if (
                isinstance(module, kinds)
                and weight is not None
                and not hasattr(weight, "tensor_model_parallel")
            ):
                dim, stride = SPLITS[name.split(".")[-1]]
                set_tensor_model_parallel_attributes(weight, True, dim, stride)

    def layout_positions(self, S: int, device=None) -> torch.Tensor:
        """``[S]``: the global positions megatron's MLA ropes this rank's ``S`` tokens at."""
        if self.cp_size == 1:
            return torch.arange(S, device=device)
        return torch.tensor(position_list(S, self.cp_size, self.cp_rank, "zigzag"), device=device)

    def _positions(self, positions, B: int, S: int, device) -> torch.Tensor:
        """``[B, S]`` positions for the decoder: the layout's, where ``positions`` has padding (< 0) kept."""
        grid = self.layout_positions(S, device).expand(B, S)
        if positions is None:
            return grid
        positions = positions.to(device).expand(B, S)
        if bool(((positions >= 0) & (positions != grid)).any()):
            layout = (
                "0..S-1"
                if self.cp_size == 1
                else f"this rank's zigzag chunks of the global sequence (CP rank {self.cp_rank} of "
                f"{self.cp_size})"
            )
            raise RingzeroError(
                f"MegatronLM takes the positions megatron's MLA ropes, {layout}; right padding "
                "may be negative, but shifted, left-padded or contiguous-shard positions would "
                "be roped wrong"
            )
        return positions

    def set_input_tensor(self, tensor) -> None:
        """The previous stage's output, which this stage's layers start from (megatron's schedule calls
        it)."""
        self.decoder.set_input_tensor(tensor[0] if isinstance(tensor, list) else tensor)

    def stage_forward(
        self, input_ids_BS: torch.Tensor, positions_BS: torch.Tensor | None = None
    ) -> torch.Tensor:
        """This stage's layers, ``[S, B, D]`` out: from the embedding on the first stage, else from the tensor
        ``set_input_tensor`` gave (``input_ids`` then only tell the shape and the positions)."""
        B, S = input_ids_BS.shape
        positions = self._positions(positions_BS, B, S, input_ids_BS.device)
        x_SBD = self.word_embeddings(input_ids_BS.t()) if self.stage.has_embedding else None
        return self.decoder(x_SBD, attention_mask=positions)

    def hidden(self, input_ids_BS: torch.Tensor, positions_BS: torch.Tensor | None = None) -> torch.Tensor:
        """Residual stream after the last layer (before the final norm), ``[B, S, D]``."""
        if self.pp_size > 1:
            raise RingzeroError(
                "a pipeline-parallel MegatronLM holds one stage of the layers: run micro-batches "
                "through ringzero.parallel.micro_batches.run_micro_batches (its 1F1B schedule)"
            )
        return self.stage_forward(input_ids_BS, positions_BS).transpose(0, 1)

    def logits(self, hidden_BSD: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits ``[B, S, V]`` (gathered over TP); fp32 under the LM-head island."""
        weight = self.word_embeddings.weight if self.cfg.tie_word_embeddings else None
        if self.policy.lm_head_fp32:
            h = self.norm(hidden_BSD, out_dtype=at_least_fp32(hidden_BSD.dtype))
            weight = None if weight is None else weight.to(h.dtype)
        else:
            h = self.norm(hidden_BSD)
        out, _ = self.output_layer(h.transpose(0, 1), weight=weight)
        return out.transpose(0, 1)

    def forward(self, input_ids_BS: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits(self.hidden(input_ids_BS, positions))
