"""ringzero's AdamW on fp32 masters over one rank's shard of a ``MegatronLM``, with full tensors at the seam.

Each rank steps the shard it holds; what crosses the engine seam is layout-free: ``master_state_dict``,
``state`` and ``load_*`` speak full tensors under ``HybridLM`` names (the moments are converted exactly as
the weights are), so a resume point written at TP = 2 loads at TP = 1 and the rollout engine receives the
same dict either engine would push. Gathers and scatters run over the TP group: every rank calls them.

Gradient clipping uses the global norm: the squares of TP-split parameters are summed over the TP group,
those of replicated ones (norm gains) counted once, so every rank clips by the same factor and replicated
parameters stay equal across the group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringzero.engines.megatron.convert import gather_hybrid, routing_buffers, to_megatron
from ringzero.errors import RingzeroError
from ringzero.stages.optimizer import TrainOptimizer


class ShardedTrainOptimizer(TrainOptimizer):
    def __init__(self, model, settings, total_steps: int, schedule: str = "cosine"):
        super().__init__(model, settings, total_steps, schedule)
        self.tp_group = None
        if model.tp_size > 1:
            from megatron.core import parallel_state

            self.tp_group = parallel_state.get_tensor_model_parallel_group()
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.split = [bool(getattr(p, "tensor_model_parallel", False)) for p in self.params]

    # -- the step ----------------------------------------------------------------------------------

    def clip_grads(self, grads: list[torch.Tensor]) -> float:
        with_grad = [(m, s) for m, s in zip(self.master, self.split, strict=True) if m.grad is not None]
        if not with_grad:
            return 0.0
        device = with_grad[0][0].grad.device
        squares = torch.zeros(2, dtype=torch.float64, device=device)  # [split, replicated]
        for m, split in with_grad:
            squares[0 if split else 1] += m.grad.detach().double().pow(2).sum()
        if self.tp_group is not None:
            split_sum = squares[:1].clone()
            dist.all_reduce(split_sum, group=self.tp_group)
            squares[0] = split_sum[0]
        norm = float(squares.sum().sqrt())
        clip = self.settings.grad_clip
        if norm == norm and norm != float("inf") and clip and norm > clip:
            scale = clip / (norm + 1e-6)
            for m, _ in with_grad:
                m.grad.mul_(scale)
        return norm

    # -- full tensors at the seam ------------------------------------------------------------------

    def _gather(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's megatron-named shards -> full tensors under HybridLM names."""
        return gather_hybrid(local, self.model)

    def _scatter(self, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return to_megatron(full, self.model.cfg, self.model.tp_rank, self.model.tp_size)

    def _local_masters(self) -> dict[str, torch.Tensor]:
        return {n: m.detach() for n, m in zip(self.names, self.master, strict=True)}

    def master_state_dict(self) -> dict[str, torch.Tensor]:
        # the MoE routing biases too: HybridLM's state dict (checkpoints, weight pushes) carries them
        return self._gather({**self._local_masters(), **routing_buffers(self.model)})

    def load_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        try:
            local = self._scatter(state)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise RingzeroError(f"{source}: cannot load into the megatron model: {exc}") from exc
        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(local))
        if missing:
            raise RingzeroError(f"{source}: no tensor for megatron parameters {missing[:5]}")
        with torch.no_grad():
            for name, p in params.items():
                if tuple(local[name].shape) != tuple(p.shape):
                    raise RingzeroError(f"{source}: {name} has shape {tuple(local[name].shape)}, this rank's "
                                        f"shard is {tuple(p.shape)}")
                p.copy_(local[name].to(p.dtype))
            for name, buf in routing_buffers(self.model).items():  # never trained, but they route
                if name not in local:
                    raise RingzeroError(f"{source}: no routing bias for {name}")
                buf.copy_(local[name])
            if self.needs_master:
                for name, m in zip(self.names, self.master, strict=True):
                    m.copy_(local[name].to(m.dtype))

    def state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Adam moments and step counts per HybridLM parameter name (full tensors), counters."""
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
                tensors.update({f"{key}.{n}": v for n, v in self._gather(local).items()})
        if self.needs_master:
            tensors.update({f"master.{n}": v for n, v in self.master_state_dict().items()})
        meta = {"steps_taken": self.steps_taken, "skipped": self.skipped, "layout": "hybrid-names",
                "adam_step": max(steps.values()) if steps else 0.0}
        return tensors, meta

    def _all_have(self, mine: bool) -> bool:
        if self.tp_group is None:
            return mine
        flag = torch.tensor([1 if mine else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.tp_group)
        return bool(flag.item())

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        if meta.get("layout") != "hybrid-names":
            raise RingzeroError("optimizer state was written by the torch engine (parameters by index); the "
                                "megatron engine reads moments by parameter name: resume with the engine that "
                                "wrote it")
        local = {}
        for key in ("exp_avg", "exp_avg_sq"):
            full = {n[len(key) + 1:]: v for n, v in tensors.items() if n.startswith(key + ".")}
            if full:
                local[key] = self._scatter(full)
        self.adam.state.clear()
        if local:
            step = torch.tensor(float(meta.get("adam_step", 0.0)))
            for name, m in zip(self.names, self.master, strict=True):
                self.adam.state[m] = {"step": step.clone(), "exp_avg": local["exp_avg"][name].to(m).clone(),
                                      "exp_avg_sq": local["exp_avg_sq"][name].to(m).clone()}
        masters = {n[len("master."):]: v for n, v in tensors.items() if n.startswith("master.")}
        if masters:
            self.load_weights(masters, source="optimizer state")
        self.steps_taken, self.skipped = int(meta["steps_taken"]), int(meta["skipped"])
