"""ringzero's AdamW on fp32 masters over one rank's shard of a ``MegatronLM``, with full tensors at the seam.

Each rank steps the shard it holds; what crosses the engine seam is layout-free: ``master_state_dict``,
``state`` and ``load_*`` speak full tensors under ``HybridLM`` names (the moments are converted exactly as
the weights are), so a resume point written at TP = 2 loads at TP = 1 and the rollout engine receives the
same dict either engine would push. Gathers and scatters run over the TP group: every rank calls them.

Gradient clipping uses the global norm: the squares of TP-split parameters are summed over the TP group,
those of the routed experts over the expert tensor-and-model-parallel group (under expert parallelism each
EP rank holds other experts), those of replicated ones (norm gains) counted once, and under pipeline
parallelism the three sums over the stages (each holds other layers), so every rank clips by the same factor
and replicated parameters stay equal across the group.

Gradient reduction: parameters every DP rank holds are summed over the ``dp_cp`` group as the torch
engine's; the routed experts (megatron marks them ``allreduce = False`` under expert parallelism) over
megatron's expert-data-parallel group only, the ranks holding the same experts (their gradients already
hold every EP rank's tokens: the dispatcher brought them there).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.engines.megatron import snapshots
from ringzero.engines.megatron.convert import gather_hybrid, load_hybrid_state_, routing_buffers, to_megatron
from ringzero.engines.megatron.gather_main import gather_to_main
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.errors import RingzeroError
from ringzero.parallel.grads import sync_grads


def is_expert(p: torch.nn.Parameter) -> bool:
    """A routed expert's weight under expert parallelism (megatron's mark: not all-reduced over DP)."""
    return not getattr(p, "allreduce", True)


@torch.no_grad()
def sum_over(params: list[torch.nn.Parameter], group) -> None:
    """Sum ``params``' gradients over ``group`` (one flat all-reduce per dtype; no gradient: zeros)."""
    for p in params:  # zeros as sync_grads gives: AdamW then steps (decays) it as the torch engine does
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params or dist.get_world_size(group) == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for dtype, bucket in by_dtype.items():
        flat = torch.cat([p.grad.reshape(-1) for p in bucket]).to(
            torch.float32 if dtype.itemsize < 4 else dtype
        )
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n


class ShardedTrainOptimizer(TrainOptimizer):
    def __init__(self, model, settings, total_steps: int, schedule: str = "cosine"):
        super().__init__(model, settings, total_steps, schedule)
        from megatron.core import parallel_state

        self.tp_group = self.expert_group = self.expert_dp_group = self.pp_group = None
        if model.tp_size > 1:
            self.tp_group = parallel_state.get_tensor_model_parallel_group()
        if getattr(model, "pp_size", 1) > 1:
            self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.ep_size = getattr(model, "ep_size", 1)
        if self.ep_size > 1:
            self.expert_group = parallel_state.get_expert_tensor_and_model_parallel_group()
            self.expert_dp_group = parallel_state.get_expert_data_parallel_group()
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.split = [bool(getattr(p, "tensor_model_parallel", False)) for p in self.params]
        self.expert = [is_expert(p) for p in self.params]

    def reduce_grads(self, groups) -> None:
        """Sum the gradients over the ``dp_cp`` ranks, the routed experts' over the ranks holding the
        same experts (megatron's expert-data-parallel group)."""
        shared = [p for p, e in zip(self.params, self.expert, strict=True) if not e]
        experts = [p for p, e in zip(self.params, self.expert, strict=True) if e]
        sync_grads(shared, groups)
        self.reduce_expert_grads(experts, groups)

    def reduce_expert_grads(self, params: list[torch.nn.Parameter], groups) -> None:
        if params:
            sum_over(params, self.expert_dp_group)

    # -- the step ----------------------------------------------------------------------------------

    def clip_grads(self, grads: list[torch.Tensor]) -> float:
        kinds = [2 if e else (0 if s else 1) for s, e in zip(self.split, self.expert, strict=True)]
        with_grad = [(m, k) for m, k in zip(self.master, kinds, strict=True) if m.grad is not None]
        if not with_grad and self.expert_group is None and self.pp_group is None:
            return 0.0
        device = with_grad[0][0].grad.device if with_grad else torch.device("cpu")
        squares = torch.zeros(3, dtype=torch.float64, device=device)  # [TP-split, replicated, routed experts]
        for m, kind in with_grad:
            squares[kind] += m.grad.detach().double().pow(2).sum()
        if self.tp_group is not None:
            split_sum = squares[:1].clone()
            dist.all_reduce(split_sum, group=self.tp_group)
            squares[0] = split_sum[0]
        if self.expert_group is not None:
            expert_sum = squares[2:].clone()
            dist.all_reduce(expert_sum, group=self.expert_group)
            squares[2] = expert_sum[0]
        self.sum_over_stages(squares)
        norm = float(squares.sum().sqrt())
        clip = self.settings.grad_clip
        if norm == norm and norm != float("inf") and clip and norm > clip:
            scale = clip / (norm + 1e-6)
            for m, _ in with_grad:
                m.grad.mul_(scale)
        return norm

    def sum_over_stages(self, squares: torch.Tensor) -> None:
        if self.pp_group is not None:
            dist.all_reduce(squares, group=self.pp_group)

    # -- full tensors at the seam ------------------------------------------------------------------

    def _gather(self, local: dict[str, torch.Tensor], everywhere: bool = True) -> dict[str, torch.Tensor]:
        """This rank's megatron-named shards -> full tensors under HybridLM names, on every rank or (not
        ``everywhere``) on rank 0 only (``{}`` elsewhere)."""
        return gather_hybrid(local, self.model) if everywhere else gather_to_main(local, self.model)

    def _scatter(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        m = self.model
        return to_megatron(
            full,
            m.cfg,
            m.tp_rank,
            m.tp_size,
            getattr(m, "ep_rank", 0),
            self.ep_size,
            getattr(m, "stage", None),
        )

    def _local_masters(self) -> dict[str, torch.Tensor]:
        return {n: m.detach() for n, m in zip(self.names, self.master, strict=True)}

    def master_state_dict(self, everywhere: bool = True) -> dict[str, torch.Tensor]:
        # the MoE routing biases too: HybridLM's state dict (checkpoints, weight pushes) carries them
        return self._gather({**self._local_masters(), **routing_buffers(self.model)}, everywhere)

    def load_weights(self, state, source: str) -> None:
        """``state``: a full HybridLM state dict or the groups of one (``load_hybrid_state_``)."""
        masters = dict(zip(self.names, self.master, strict=True)) if self.needs_master else {}

        def to_master(name: str, shard: torch.Tensor) -> None:
            if name in masters:  # the given fp32 values, not their casts to the body dtype
                masters[name].copy_(shard.to(masters[name].dtype))

        with torch.no_grad():
            load_hybrid_state_(self.model, state, source, on_tensor=to_master)

    def state(self, everywhere: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
        """Adam moments and step counts per HybridLM parameter name (full tensors; on rank 0 only when not
        ``everywhere``), counters."""
        moments: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
        steps: dict[str, float] = {}
        for name, m in zip(self.names, self.master, strict=True):
            slot = self.adam.state.get(m)
            if not slot:
                continue
            for key in moments:
                moments[key][name] = slot[key].detach()
            steps[name] = float(slot["step"])
        tensors: dict[str, torch.Tensor] = {}
        for key, local in moments.items():
            # every rank takes part in every gather, with or without moments yet
            have = self._all_have(bool(local))
            if have:
                tensors.update({f"{key}.{n}": v for n, v in self._gather(local, everywhere).items()})
        if self.needs_master:
            tensors.update({f"master.{n}": v for n, v in self.master_state_dict(everywhere).items()})
        meta = {
            "steps_taken": self.steps_taken,
            "skipped": self.skipped,
            "layout": "hybrid-names",
            "adam_step": max(steps.values()) if steps else 0.0,
        }
        return tensors, meta

    def _all_have(self, mine: bool) -> bool:
        """Whether every rank of the job has the tensors (the gathers that follow span TP, EP and the
        pipeline stages, so all of those must agree)."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return mine
        flag = torch.tensor([1 if mine else 0], device=self.master[0].device if self.master else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    # -- rollback: this rank's own shards, no collective ----------------------------------------------

    def local_snapshot(self) -> dict:
        """This rank's parameters, routing biases, fp32 masters, Adam slots and counters, copied to the host:
        what a rollback restores, without gathering the full model onto any rank (``snapshots``)."""
        return {
            **snapshots.snapshot(self.model, self.params, [self.adam]),
            "steps_taken": self.steps_taken,
            "skipped": self.skipped,
        }

    def restore_local(self, snap: dict) -> None:
        """Put ``local_snapshot``'s values back, bit for bit."""
        snapshots.restore(self.model, self.params, [self.adam], snap)
        self.steps_taken, self.skipped = snap["steps_taken"], snap["skipped"]

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        if meta.get("layout") != "hybrid-names":
            raise RingzeroError(
                "optimizer state was written by the torch engine (parameters by index); the "
                "megatron engine reads moments by parameter name: resume with the engine that "
                "wrote it"
            )
        local = {}
        for key in ("exp_avg", "exp_avg_sq"):
            full = {n[len(key) + 1 :]: v for n, v in tensors.items() if n.startswith(key + ".")}
            if full:
                local[key] = self._scatter(full)
        self.adam.state.clear()
        if local:
            step = torch.tensor(float(meta.get("adam_step", 0.0)))
            for name, m in zip(self.names, self.master, strict=True):
                self.adam.state[m] = {
                    "step": step.clone(),
                    "exp_avg": local["exp_avg"][name].to(m).clone(),
                    "exp_avg_sq": local["exp_avg_sq"][name].to(m).clone(),
                }
        masters = {n[len("master.") :]: v for n, v in tensors.items() if n.startswith("master.")}
        if masters:
            self.load_weights(masters, source="optimizer state")
        self.steps_taken, self.skipped = int(meta["steps_taken"]), int(meta["skipped"])
