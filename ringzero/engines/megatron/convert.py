"""Weights between ``HybridLM`` (state-dict keys = Ling 2.5 tensor names without ``model.``) and
``MegatronLM``, one tensor-parallel shard per rank.

- names: ``layers.{i}.attention.*`` <-> ``decoder.layers.{i}.self_attention.*`` (MLA projections renamed,
  Lightning ones kept), ``post_attention_layernorm`` <-> ``pre_mlp_layernorm``, the MLP's
  ``gate_proj``/``up_proj``/``down_proj`` <-> ``linear_fc1`` (gate rows, then up rows) / ``linear_fc2``,
  ``lm_head`` <-> ``output_layer``;
- MoE layers: ``mlp.gate.weight`` / ``mlp.gate.expert_bias`` (a buffer) <-> ``mlp.router.weight`` /
  ``mlp.router.expert_bias``, ``mlp.experts.{j}.*`` <-> ``mlp.experts.local_experts.{j}.*`` and
  ``mlp.shared_experts.*`` kept, each SwiGLU fused and split as the dense MLP's, each split over TP;
- experts over EP: with ``ep`` expert-parallel ranks EP rank ``r`` holds global experts
  ``r * E / ep .. (r + 1) * E / ep - 1`` as ``local_experts.0 ..`` (``expert_shard``); gathers collect them
  over megatron's expert-model-parallel group, under their global indices;
- shards: column-parallel weights split on rows, row-parallel ones on columns, norms replicated (except
  Lightning's ``g_norm``, split by channel; the router and its bias replicated). A split with stride ``s``
  cuts the full rows into ``s * tp`` equal chunks and gives rank ``r`` chunks ``r, tp + r, ...`` (megatron's
  ``partition_stride``): ``linear_fc1`` has stride 2 (each rank's gate rows, then its up rows) and Lightning's
  ``query_key_value`` stride 3 (each rank's q, k and v heads);
- pipeline stages (``StageLayers``): a stage holds global layers ``first .. first + count - 1`` as its
  ``decoder.layers.0 ..``, the embedding only on the first stage, the final norm and the head only on the
  last; ``to_megatron`` keeps a stage's tensors only, and gathers rename them back and collect every
  stage's over megatron's pipeline group (each stage's tensors broadcast from its rank, name by name);
- RoPE rows: megatron's MLA always reorders the rotary slice from pair-neighbour to rotate-half order
  (ringzero's ``rope_interleave: true``, Ling 2.5's default). With ``rope_interleave: false`` the rotary
  rows of the query projection (per head) and of ``kv_a_proj_with_mqa`` (its last ``dr``) are permuted
  into pair-neighbour order on the way in, and back on the way out.

Letter legend for the permutations: p qk_rope_head_dim (dr).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from megatron.core import parallel_state

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig
from ringzero.model.mla import deinterleave

# HybridLM attention name -> MegatronLM's, for MLA layers (Lightning layers keep their names).
MLA_NAMES = {
    "q_proj": "linear_q_proj",
    "q_a_proj": "linear_q_down_proj",
    "q_a_layernorm": "q_layernorm",
    "q_b_proj": "linear_q_up_proj",
    "kv_a_proj_with_mqa": "linear_kv_down_proj",
    "kv_a_layernorm": "kv_layernorm",
    "kv_b_proj": "linear_kv_up_proj",
    "dense": "linear_proj",
}
# MegatronLM module name (last part) -> (split dim, stride); absent: replicated on every rank.
SPLITS = {
    "word_embeddings": (0, 1),
    "output_layer": (0, 1),
    "linear_q_proj": (0, 1),
    "linear_q_down_proj": (0, 1),
    "linear_q_up_proj": (0, 1),
    "linear_kv_down_proj": (0, 1),
    "linear_kv_up_proj": (0, 1),
    "linear_proj": (1, 1),
    "query_key_value": (0, 3),
    "g_proj": (0, 1),
    "g_norm": (0, 1),
    "dense": (1, 1),
    "linear_fc1": (0, 2),
    "linear_fc2": (1, 1),
}


@dataclass(frozen=True)
class StageLayers:
    """What one pipeline stage holds of the model (see the module docstring); ``whole`` at pp = 1."""

    first: int
    count: int
    has_embedding: bool = True
    has_head: bool = True

    @classmethod
    def of(cls, num_layers: int, pp_rank: int, pp_size: int) -> StageLayers:
        per = num_layers // pp_size
        return cls(pp_rank * per, per, pp_rank == 0, pp_rank == pp_size - 1)

    def to_local(self, name: str) -> str | None:
        """A MegatronLM name under global layer numbers -> this stage's name; None when another stage holds
        it."""
        head = name.split(".")[0]
        if head == "word_embeddings":
            return name if self.has_embedding else None
        if head in ("norm", "output_layer"):
            return name if self.has_head else None
        if head != "decoder":
            return name
        parts = name.split(".")
        i = int(parts[2])
        if not self.first <= i < self.first + self.count:
            return None
        return ".".join(["decoder", "layers", str(i - self.first), *parts[3:]])

    def to_global(self, name: str) -> str:
        parts = name.split(".")
        if parts[0] != "decoder" or self.first == 0:
            return name
        return ".".join(["decoder", "layers", str(int(parts[2]) + self.first), *parts[3:]])


def _split(full: torch.Tensor, dim: int, stride: int, rank: int, size: int) -> torch.Tensor:
    chunks = full.chunk(stride * size, dim=dim)
    return torch.cat([chunks[j * size + rank] for j in range(stride)], dim=dim)


def _merge(shards: list[torch.Tensor], dim: int, stride: int) -> torch.Tensor:
    pieces = [s.chunk(stride, dim=dim) for s in shards]
    return torch.cat([pieces[r][j] for j in range(stride) for r in range(len(shards))], dim=dim)


def _interleave_rows(w: torch.Tensor) -> torch.Tensor:
    """Rows from rotate-half order ``0..p/2-1 | p/2..p-1`` to pair-neighbour order (``deinterleave``'s
    inverse)."""
    return w.unflatten(0, (2, -1)).transpose(0, 1).flatten(0, 1)


def _deinterleave_rows(w: torch.Tensor) -> torch.Tensor:
    return deinterleave(w.transpose(0, -1)).transpose(0, -1)


def _rope_rows(name: str, w: torch.Tensor, cfg: ModelConfig, permute) -> torch.Tensor:
    """Apply ``permute`` to the rotary rows of an MLA projection (HybridLM name), others unchanged."""
    dn, dr, r = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    module = name.split(".")[-2]
    if module in ("q_proj", "q_b_proj"):
        heads = w.unflatten(0, (cfg.num_attention_heads, dn + dr))
        rope = torch.stack([permute(h[dn:]) for h in heads])
        return torch.cat([heads[:, :dn], rope], dim=1).flatten(0, 1)
    if module == "kv_a_proj_with_mqa":
        return torch.cat([w[:r], permute(w[r:])])
    return w


def _megatron_name(key: str, cfg: ModelConfig) -> str:
    parts = key.split(".")
    if parts[0] == "lm_head":
        return "output_layer." + ".".join(parts[1:])
    if parts[0] != "layers":
        return key
    i, rest = int(parts[1]), parts[2:]
    kind = cfg.layer_types()[i]
    if rest[0] == "attention":
        module = MLA_NAMES.get(rest[1], rest[1]) if kind == "mla" else rest[1]
        rest = ["self_attention", module, *rest[2:]]
    elif rest[0] == "post_attention_layernorm":
        rest = ["pre_mlp_layernorm", *rest[1:]]
    elif rest[0] == "mlp":
        head = {"gate": ["router"], "experts": ["experts", "local_experts"]}.get(rest[1], [rest[1]])
        rest = ["mlp", *head, *rest[2:]]
        rest[-2] = {"down_proj": "linear_fc2"}.get(rest[-2], rest[-2])
    return ".".join(["decoder", "layers", str(i), *rest])


def _hybrid_name(name: str, cfg: ModelConfig) -> str:
    parts = name.split(".")
    if parts[0] == "output_layer":
        return "lm_head." + ".".join(parts[1:])
    if parts[0] != "decoder":
        return name
    i, rest = int(parts[2]), parts[3:]
    if rest[0] == "self_attention":
        inverse = {v: k for k, v in MLA_NAMES.items()} if cfg.layer_types()[i] == "mla" else {}
        rest = ["attention", inverse.get(rest[1], rest[1]), *rest[2:]]
    elif rest[0] == "pre_mlp_layernorm":
        rest = ["post_attention_layernorm", *rest[1:]]
    elif rest[0] == "mlp":
        head = {"router": ["gate"], "experts": ["experts"]}.get(rest[1], [rest[1]])
        rest = ["mlp", *head, *rest[3 if rest[1] == "experts" else 2 :]]
        rest[-2] = {"linear_fc2": "down_proj"}.get(rest[-2], rest[-2])
    return ".".join(["layers", str(i), *rest])


def _full_megatron(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The whole (TP = 1) MegatronLM state of a HybridLM state."""
    out = {}
    for key, w in state.items():
        if ".mlp." in key and key.endswith((".gate_proj.weight", ".up_proj.weight")):
            continue
        if ".mlp." in key and key.endswith(".down_proj.weight"):
            prefix = key[: -len("down_proj.weight")]
            out[_megatron_name(prefix + "linear_fc1.weight", cfg)] = torch.cat(
                [state[prefix + "gate_proj.weight"], state[prefix + "up_proj.weight"]]
            )
        if not cfg.rope_interleave:
            w = _rope_rows(key, w, cfg, _interleave_rows)
        out[_megatron_name(key, cfg)] = w
    return out


LOCAL_EXPERTS = ".mlp.experts.local_experts."


def _expert_index(name: str) -> tuple[str, int, str] | None:
    """``(head, j, tail)`` of an expert tensor's megatron name ``head + str(j) + tail``; None for others."""
    if LOCAL_EXPERTS not in name:
        return None
    head, rest = name.split(LOCAL_EXPERTS, 1)
    j, tail = rest.split(".", 1)
    return head + LOCAL_EXPERTS, int(j), "." + tail


def expert_shard(state: dict[str, torch.Tensor], cfg: ModelConfig, ep_rank: int, ep_size: int) -> dict:
    """EP rank ``ep_rank``'s routed experts (of ``ep_size`` shards) of a MegatronLM-named dict with every
    expert, renumbered from 0; the other tensors unchanged."""
    if ep_size == 1:
        return state
    if cfg.num_experts % ep_size:
        raise RingzeroError(
            f"{cfg.num_experts} experts do not split into {ep_size} equal expert-parallel shards"
        )
    per = cfg.num_experts // ep_size
    out = {}
    for name, w in state.items():
        parts = _expert_index(name)
        if parts is None:
            out[name] = w
        elif parts[1] // per == ep_rank:
            out[f"{parts[0]}{parts[1] % per}{parts[2]}"] = w
    return out


def to_megatron(
    state: dict[str, torch.Tensor],
    cfg: ModelConfig,
    tp_rank: int,
    tp_size: int,
    ep_rank: int = 0,
    ep_size: int = 1,
    stage: StageLayers | None = None,
) -> dict:
    """Rank ``tp_rank``'s shard (of ``tp_size``) of a HybridLM state dict, under MegatronLM's names, with
    EP rank ``ep_rank``'s experts (of ``ep_size`` shards) only, and ``stage``'s layers only (all when
    None)."""
    out = {}
    for name, w in expert_shard(_full_megatron(state, cfg), cfg, ep_rank, ep_size).items():
        if stage is not None:
            name = stage.to_local(name)
            if name is None:
                continue
        split = SPLITS.get(name.split(".")[-2])
        if split is not None:
            dim, stride = split
            if w.shape[dim] % (stride * tp_size):
                raise RingzeroError(
                    f"{name}: {w.shape[dim]} rows/columns do not split into {stride} x "
                    f"{tp_size} equal tensor-parallel chunks"
                )
            w = _split(w, dim, stride, tp_rank, tp_size)
        out[name] = w.clone()
    return out


def from_megatron(shards: list[dict[str, torch.Tensor]], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The full HybridLM state dict from every TP rank's MegatronLM shard, in rank order."""
    out = {}
    for name in shards[0]:
        split = SPLITS.get(name.split(".")[-2])
        parts = [s[name] for s in shards]
        w = parts[0] if split is None else _merge(parts, *split)
        key = _hybrid_name(name, cfg)
        if ".mlp." in key and key.endswith(".linear_fc1.weight"):
            prefix = key[: -len("linear_fc1.weight")]
            out[prefix + "gate_proj.weight"], out[prefix + "up_proj.weight"] = w.chunk(2)
            continue
        if not cfg.rope_interleave:
            w = _rope_rows(key, w, cfg, _deinterleave_rows)
        out[key] = w.clone()
    return out


def _local_tensors(model) -> dict[str, torch.Tensor]:
    """The parameters and the routing-only expert biases (buffers: HybridLM's state dict has them too)."""
    return {**dict(model.named_parameters()), **routing_buffers(model)}


def routing_buffers(model) -> dict[str, torch.Tensor]:
    """``MegatronLM``'s expert-bias buffers by name (not ``local_tokens_per_expert``: load statistics)."""
    return {n: b for n, b in model.named_buffers() if n.endswith("router.expert_bias") and b is not None}


def group_of(key: str) -> str:
    """The group a HybridLM key converts in: its layer (the fused MLP and the RoPE rows need the layer's
    tensors together), or the tensor alone (embedding, final norm, head)."""
    parts = key.split(".")
    return f"layers.{parts[1]}" if parts[0] == "layers" else key


def layer_groups(state: Mapping[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """``state`` cut into the groups that each convert alone, so no whole converted copy is ever made."""
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        groups.setdefault(group_of(key), {})[key] = t
    return list(groups.values())


@torch.no_grad()
def load_hybrid_state_(model, state, source: str = "HybridLM state", on_tensor=None) -> None:
    """Copy HybridLM tensors into ``model`` (a MegatronLM): this rank's shard of each parameter and routing
    bias, cast to its dtype. ``state`` is a full HybridLM state dict, or an iterable of partial ones that
    each convert alone (``streamed.stage_state``: a layer at a time); either way it is converted and
    copied one group at a time, so only one group's converted tensors exist at once. ``on_tensor(name,
    shard)`` sees each converted shard (megatron name, the given values before any cast): an optimizer
    copies its fp32 masters from it."""
    groups = layer_groups(state) if isinstance(state, Mapping) else state
    params = _local_tensors(model)
    loaded: set[str] = set()
    for group in groups:
        try:
            shard = to_megatron(
                group,
                model.cfg,
                model.tp_rank,
                model.tp_size,
                model.ep_rank,
                model.ep_size,
                getattr(model, "stage", None),
            )
        except (KeyError, ValueError, RuntimeError) as exc:
            raise RingzeroError(f"{source}: cannot load into the megatron model: {exc}") from exc
        unexpected = sorted(set(shard) - set(params))
        wrong = [
            f"{n} {list(t.shape)} vs {list(params[n].shape)}"
            for n, t in shard.items()
            if n in params and t.shape != params[n].shape
        ]
        if unexpected or wrong:
            raise RingzeroError(
                f"{source} does not fit this rank's MegatronLM shard: unexpected {unexpected[:5]}, "
                f"mis-shaped {wrong[:5]}"
            )
        for name, t in shard.items():
            params[name].copy_(t.to(params[name].dtype))
            if on_tensor is not None:
                on_tensor(name, t)
        loaded.update(shard)
    missing = sorted(set(params) - loaded)
    if missing:
        raise RingzeroError(f"{source} does not fit this rank's MegatronLM shard: missing {missing[:5]}")


def _collect(t: torch.Tensor, size: int, group, to_first: bool = False) -> list[torch.Tensor] | None:
    """Every rank's ``t`` in ``group`` order: on every rank (all-gather), or with ``to_first`` on the
    group's first rank only (gather; None elsewhere)."""
    t = t.contiguous()
    if not to_first:
        parts = [torch.empty_like(t) for _ in range(size)]
        torch.distributed.all_gather(parts, t, group=group)
        return parts
    first = torch.distributed.get_process_group_ranks(group)[0]
    parts = [torch.empty_like(t) for _ in range(size)] if torch.distributed.get_rank() == first else None
    torch.distributed.gather(t, parts, dst=first, group=group)
    return parts


def gather_experts(local: dict[str, torch.Tensor], model, to_first: bool = False) -> dict[str, torch.Tensor]:
    """This rank's tensors with its local experts replaced by every EP rank's, under global indices (a
    collective over the expert-model-parallel group; every rank holds the same names and shapes). With
    ``to_first`` only the group's first rank receives the experts (the others keep the rest)."""
    if getattr(model, "ep_size", 1) == 1:
        return local
    group = parallel_state.get_expert_model_parallel_group()
    per = model.cfg.num_experts // model.ep_size
    out = {}
    for name, t in local.items():
        parts = _expert_index(name)
        if parts is None:
            out[name] = t
            continue
        for r, g in enumerate(_collect(t, model.ep_size, group, to_first) or []):
            out[f"{parts[0]}{r * per + parts[1]}{parts[2]}"] = g
    return out


def gather_tp(local: dict[str, torch.Tensor], model, to_first: bool = False) -> list[dict[str, torch.Tensor]]:
    """Every TP rank's shard of each of ``local``'s tensors, in rank order: on every rank, or with
    ``to_first`` on TP rank 0 only (the other ranks' lists stay empty)."""
    group = parallel_state.get_tensor_model_parallel_group()
    shards: list[dict] = [{} for _ in range(model.tp_size)]
    for name, t in local.items():
        for r, part in enumerate(_collect(t, model.tp_size, group, to_first) or []):
            shards[r][name] = part
    return shards


def gather_hybrid(local: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Full HybridLM tensors from this rank's MegatronLM-named tensors (weights, or their gradients),
    gathered over the EP group (experts), the TP group and the pipeline stages; every rank gets the result
    (``gather_main.gather_to_main``: rank 0 only)."""
    stage = getattr(model, "stage", None)
    if stage is not None:
        local = {stage.to_global(n): t for n, t in local.items()}
    local = gather_experts(local, model)
    if model.tp_size == 1:
        return _gather_stages(from_megatron([local], model.cfg), model)
    return _gather_stages(from_megatron(gather_tp(local, model), model.cfg), model)


def _gather_stages(mine: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Every pipeline stage's full tensors on every rank: each stage broadcasts its names and shapes, then
    its tensors one by one, over megatron's pipeline group (a collective; ``mine`` when pp = 1)."""
    if getattr(model, "pp_size", 1) == 1:
        return mine
    group = parallel_state.get_pipeline_model_parallel_group()
    me = torch.distributed.get_rank()
    device = next(iter(mine.values())).device if mine else torch.device("cpu")
    out: dict[str, torch.Tensor] = {}
    for src in torch.distributed.get_process_group_ranks(group):
        box = [{n: (tuple(t.shape), t.dtype) for n, t in mine.items()} if src == me else None]
        torch.distributed.broadcast_object_list(box, src=src, group=group)
        for name, (shape, dtype) in box[0].items():
            t = mine[name].contiguous() if src == me else torch.empty(shape, dtype=dtype, device=device)
            torch.distributed.broadcast(t, src=src, group=group)
            out[name] = t
    return out


@torch.no_grad()
def hybrid_state(model) -> dict[str, torch.Tensor]:
    """``model``'s weights as a full HybridLM state dict (a collective over the TP group)."""
    return gather_hybrid({n: p.detach() for n, p in _local_tensors(model).items()}, model)


def hybrid_grads(model) -> dict[str, torch.Tensor]:
    """``model``'s parameter gradients under HybridLM's names, full (a collective over the TP group)."""
    return gather_hybrid({n: p.grad for n, p in _local_tensors(model).items() if p.grad is not None}, model)
