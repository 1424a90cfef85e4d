"""megatron-core's distributed optimizer behind the engine seam: Adam state sharded over the data-parallel
ranks.

``MegatronDistributedOptimizer`` wraps the ``MegatronLM`` in megatron's ``DistributedDataParallel``
(``use_distributed_optimizer=True``: one contiguous fp32 gradient buffer, reduce-scattered over the
data-parallel group (with the CP ranks; the routed experts' over their expert-data-parallel group), each
rank owning a contiguous range of it) and steps megatron's
``DistributedOptimizer`` (``get_megatron_optimizer``; without TE or apex it runs ``torch.optim.AdamW`` on
this rank's fp32 main-parameter shards, then all-gathers the parameters). The trainer still calls the
``MegatronLM`` itself (``hidden``/``logits``): DDP's hooks sit on its parameters and its buffers hold
their storage.

- Gradient reduction belongs to the optimizer: ``reduce_grads`` is megatron's ``finish_grad_sync`` (the
  gradients are *summed*, not averaged: ringzero's losses are normalized by the global token count, so
  the config says ``calculate_per_token_loss``); ``step`` runs it itself when the caller did not (one
  process).
- The step is ringzero's: lr from ``lr_at``, the global gradient norm (megatron's, over every shard and
  the TP group), a non-finite norm skips the step (counted; moments untouched), else clipping to
  ``grad_clip`` and megatron's inner step. megatron's own ``step()`` would apply a NaN gradient when no
  loss scaler is set, so it is not called.
- Weight decay: megatron exempts 1-D parameters and biases, ringzero parameters with ``dim < 2``; the
  model has no biases, so the two rules pick the same parameters.
- Adam: ``torch.optim.AdamW`` with ringzero's betas, ``eps`` 1e-8 and decoupled weight decay, as
  ``TrainOptimizer``'s; the update is the same function of the same numbers.
- Full tensors at the seam: ``master_state_dict``, ``state`` and ``load_*`` speak full tensors under
  ``HybridLM`` names, as ``ShardedTrainOptimizer``'s (``layout: hybrid-names``), so resume points move
  between the two megatron optimizers and between layouts. Each rank's shards of the main parameters and
  moments are put into zero full (TP-local) tensors and summed over the ranks megatron shards them over
  (every element lives on exactly one of them): the data-parallel group with the CP ranks, and for the
  routed experts under ``ep`` > 1 their expert-data-parallel group; then gathered over TP (and EP).
  Loading takes each rank's range back out.
  All of these are collectives over the whole job.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist

from ringzero.engines.megatron import snapshots
from ringzero.engines.megatron.convert import gather_hybrid, load_hybrid_state_, routing_buffers, to_megatron
from ringzero.engines.megatron.gather_main import gather_to_main
from ringzero.engines.optimizer import StepReport, lr_at
from ringzero.errors import RingzeroError

MOMENTS = ("exp_avg", "exp_avg_sq")


def is_expert(p: torch.nn.Parameter) -> bool:
    """A routed expert's weight: megatron marks them ``allreduce = False`` (not summed over all DP ranks)."""
    return not getattr(p, "allreduce", True)


class MegatronDistributedOptimizer:
    def __init__(self, model, settings, total_steps: int, schedule: str = "cosine"):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        from ringzero.engines.megatron import cpu_shim

        cpu_shim.apply_optimizer()
        self.model, self.settings = model, settings
        self.total_steps, self.schedule = total_steps, schedule
        self.steps_taken = 0
        self.skipped = 0
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        dtypes = {p.dtype for p in model.parameters()}
        bf16 = torch.bfloat16 in dtypes
        ddp_config = DistributedDataParallelConfig(
            use_distributed_optimizer=True,
            overlap_grad_reduce=False,
            overlap_param_gather=False,
            grad_reduce_in_fp32=True,
            bucket_size=None,
        )
        config = copy.copy(model.config)  # not dataclasses.replace: the checks would refuse a pipeline's
        config.calculate_per_token_loss = True  # variable_seq_lengths set after them (MegatronLM)
        self.ddp = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        beta1, beta2 = settings.betas
        self.opt = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=settings.lr,
                weight_decay=settings.weight_decay,
                adam_beta1=beta1,
                adam_beta2=beta2,
                adam_eps=1e-8,
                clip_grad=settings.grad_clip,
                bf16=bf16,
                params_dtype=torch.bfloat16 if bf16 else torch.float32,
                use_distributed_optimizer=True,
            ),
            [self.ddp],
        )
        self.parts = list(getattr(self.opt, "chained_optimizers", [self.opt]))
        self.params = [p for p in model.parameters() if p.requires_grad]
        # which megatron optimizer holds a shard of each parameter on this rank (none: no shard here), and
        # that shard's fp32 main copy. Not through ``model_param_group_index_map``: megatron reorders each
        # optimizer group by dtype (fp32 parameters first, then the mains of the 16-bit ones), so with a
        # bf16 body and fp32 norms a group's n-th parameter is not its n-th main.
        self.owner, self.mains = {}, {}
        for part in self.parts:
            pairs = (
                (part.model_float16_groups, part.shard_fp32_from_float16_groups),
                (part.model_fp32_groups, part.shard_fp32_groups),
            )
            for models, mains in pairs:
                for model_group, main_group in zip(models, mains, strict=True):
                    for p, main in zip(model_group, main_group, strict=True):
                        self.owner[p], self.mains[p] = part, main
        self._reduced = False

    # -- the step ----------------------------------------------------------------------------------

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.opt.zero_grad()
        for p in self.params:
            p.grad = None
        self._reduced = False

    def reduce_grads(self, groups=None) -> None:
        """Sum the gradients over the data-parallel ranks, each keeping its own range (reduce-scatter)."""
        self.ddp.finish_grad_sync()
        self._reduced = True

    def step(self) -> StepReport:
        from megatron.core.optimizer import clip_grads

        lr = lr_at(
            self.steps_taken, self.settings.lr, self.settings.warmup_steps, self.total_steps, self.schedule
        )
        self.steps_taken += 1
        if not self._reduced:
            self.reduce_grads()
        self.opt.prepare_grads()
        norm = float(self.opt.get_grad_norm())
        if not math.isfinite(norm):
            self.skipped += 1
            self.zero_grad()
            return StepReport(lr, norm, skipped=True)
        for part in self.parts:
            for group in part.param_groups:
                group["lr"] = lr
            if self.settings.grad_clip:
                clip_grads.clip_grad_by_total_norm_fp32(part.get_parameters(), self.settings.grad_clip, norm)
        self.opt.step_with_ready_grads()
        self.zero_grad()
        return StepReport(lr, norm, skipped=False)

    # -- shards <-> full tensors -------------------------------------------------------------------

    def _range(self, p):
        part = self.owner[p]
        r = part._get_model_param_range_map(p)["param"]
        return r.start, r.end

    def _dp_full(self, key: str) -> dict[str, torch.Tensor] | None:
        """Every parameter's ``key`` (``param`` or a moment) on this rank's TP (and EP) shard, megatron
        names, summed over the ranks megatron shards it over; None when some rank has no such state yet.
        Those ranks: the data-parallel group with the CP ranks for the replicated parameters, the
        expert-data-parallel group (the ranks holding the same experts) for the routed experts."""
        from megatron.core import parallel_state

        have = all(
            key == "param" or key in self.owner[p].optimizer.state.get(self._main(p), {})
            for p in self.params
            if p in self.owner
        )
        device = self.params[0].device if self.params else torch.device("cpu")  # NCCL reduces device tensors
        flag = torch.tensor([1 if have else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if not flag.item():
            return None
        out = {}
        groups = (
            ("dense", parallel_state.get_data_parallel_group(with_context_parallel=True)),
            ("expert", parallel_state.get_expert_data_parallel_group()),
        )
        for kind, group in groups:
            chosen = [
                (n, p)
                for n, p in zip(self.names, self.params, strict=True)
                if is_expert(p) == (kind == "expert")
            ]
            sizes = [p.numel() for _, p in chosen]
            flat = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
            offset = 0
            for (_, p), n in zip(chosen, sizes, strict=True):
                if p in self.owner:
                    start, end = self._range(p)
                    main = self._main(p)
                    value = main if key == "param" else self.owner[p].optimizer.state[main][key]
                    flat[offset + start : offset + end] = value.detach().reshape(-1).float()
                offset += n
            if chosen:
                dist.all_reduce(flat, group=group)
            offset = 0
            for (name, p), n in zip(chosen, sizes, strict=True):
                out[name] = flat[offset : offset + n].view(p.shape).clone()
                offset += n
        return out

    def _main(self, p):
        return self.mains[p]

    def _scatter(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        m = self.model
        return to_megatron(full, m.cfg, m.tp_rank, m.tp_size, m.ep_rank, m.ep_size, getattr(m, "stage", None))

    def local_moment_elements(self) -> int:
        """The Adam moment elements this rank holds (each of ``exp_avg``/``exp_avg_sq``)."""
        return sum(
            state["exp_avg"].numel()
            for part in self.parts
            for state in part.optimizer.state.values()
            if "exp_avg" in state
        )

    # -- full tensors at the seam ------------------------------------------------------------------

    def master_state_dict(self, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """Full fp32 masters under HybridLM names, on every rank or (not ``everywhere``) rank 0 only."""
        local = self._dp_full("param")
        local = {**local, **{n: b.detach() for n, b in routing_buffers(self.model).items()}}
        return gather_hybrid(local, self.model) if everywhere else gather_to_main(local, self.model)

    def load_weights(self, state, source: str) -> None:
        """``state``: a full HybridLM state dict or the groups of one (``load_hybrid_state_``)."""
        params = dict(self.model.named_parameters())

        def to_main(name: str, shard: torch.Tensor) -> None:
            p = params.get(name)
            if (
                p is not None and p in self.owner
            ):  # the fp32 main shard gets the given values, not their casts
                start, end = self._range(p)
                self._main(p).copy_(shard.reshape(-1)[start:end].to(torch.float32))

        with torch.no_grad():
            load_hybrid_state_(self.model, state, source, on_tensor=to_main)

    def state(self, everywhere: bool = True) -> tuple[dict[str, torch.Tensor], dict]:
        """Adam moments (gathered from every data-parallel shard) and master weights per HybridLM name (on
        rank 0 only when not ``everywhere``)."""
        tensors: dict[str, torch.Tensor] = {}
        for key in MOMENTS:
            local = self._dp_full(key)
            if local is not None:
                full = gather_hybrid(local, self.model) if everywhere else gather_to_main(local, self.model)
                tensors.update({f"{key}.{n}": v for n, v in full.items()})
        tensors.update({f"master.{n}": v for n, v in self.master_state_dict(everywhere).items()})
        steps = [
            float(part.optimizer.state[m]["step"])
            for part in self.parts
            for m in part.optimizer.state
            if "step" in part.optimizer.state[m]
        ]
        # Transformer Engine's FusedAdam (megatron's choice where TE imports) counts steps per group
        steps += [float(g["step"]) for part in self.parts for g in part.optimizer.param_groups if "step" in g]
        meta = {
            "steps_taken": self.steps_taken,
            "skipped": self.skipped,
            "layout": "hybrid-names",
            "adam_step": max(steps) if steps else 0.0,
        }
        return tensors, meta

    # -- rollback: this rank's own shards, no collective ----------------------------------------------

    def local_snapshot(self) -> dict:
        """This rank's model parameters, routing biases, fp32 main-parameter shards, their Adam slots and
        the counters, copied to the host: what a rollback restores, without gathering anything
        (``snapshots``)."""
        return {
            **snapshots.snapshot(self.model, self.params, [part.optimizer for part in self.parts]),
            "steps_taken": self.steps_taken,
            "skipped": self.skipped,
        }

    def restore_local(self, snap: dict) -> None:
        """Put ``local_snapshot``'s values back, bit for bit."""
        snapshots.restore(self.model, self.params, [part.optimizer for part in self.parts], snap)
        self.steps_taken, self.skipped = snap["steps_taken"], snap["skipped"]

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        if meta.get("layout") != "hybrid-names":
            raise RingzeroError(
                "optimizer state was written by the torch engine (parameters by index); the "
                "megatron engine reads moments by parameter name: resume with the engine that "
                "wrote it"
            )
        masters = {n[len("master.") :]: v for n, v in tensors.items() if n.startswith("master.")}
        if masters:
            self.load_weights(masters, source="optimizer state")
        local = {}
        for key in MOMENTS:
            full = {n[len(key) + 1 :]: v for n, v in tensors.items() if n.startswith(key + ".")}
            if full:
                local[key] = self._scatter(full)
        for part in self.parts:
            part.optimizer.state.clear()
        if len(local) == len(MOMENTS):
            step = torch.tensor(float(meta.get("adam_step", 0.0)))
            for part in self.parts:
                for group in part.optimizer.param_groups:
                    if "step" in group:  # FusedAdam's per-group count, in the type it keeps
                        group["step"] = (
                            type(group["step"])(int(step))
                            if not torch.is_tensor(group["step"])
                            else step.clone().to(group["step"])
                        )
            for name, p in zip(self.names, self.params, strict=True):
                if p not in self.owner:
                    continue
                start, end = self._range(p)
                main = self._main(p)
                self.owner[p].optimizer.state[main] = {
                    "step": step.clone(),
                    **{key: local[key][name].reshape(-1)[start:end].to(main).clone() for key in MOMENTS},
                }
        self.steps_taken, self.skipped = int(meta["steps_taken"]), int(meta["skipped"])
