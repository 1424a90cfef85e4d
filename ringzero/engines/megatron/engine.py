"""The megatron-core training engine behind the seam: ``MegatronLM`` split over the job's TP groups.

megatron-core keeps its process groups in module state (``parallel_state``); ``join`` initializes it once
per process from the job's ``Runtime`` so that its tensor- and context-parallel groups are the runtime's
(both order ranks ``rank = p * dp * cp * tp + (d * cp + c) * tp + t``: TP innermost, then CP, pipeline
stages outermost), and checks a second call asks for the same layout. A job
of one process joins a one-rank gloo group first: megatron-core's layers need torch.distributed.
Expert parallelism (``ep`` > 1) is carved out of the DP x CP ranks, as megatron-core does
(``ParallelDims.ep_index``); ``join`` checks megatron's groups are those.

A checkpoint is streamed into each rank a layer at a time (``streamed.stage_state``: a pipeline stage reads
only the shard files of its own layers) and scattered with ``convert.to_megatron``, so no rank ever holds
the full model; a fresh model (no checkpoint) is drawn whole, seeded, then dropped. A rank keeps its
shards and their optimizer state only. A single-device serving
``HybridLM`` is built from the optimizer's masters when something samples or evaluates in-process
(``TrainingSetup.served``); a stage whose rollouts run on SGLang servers never builds one.
The optimizer is ``ShardedTrainOptimizer`` (ringzero's AdamW on each TP shard, full state on every DP
rank), or with ``distributed_optimizer: true`` megatron's ``DistributedOptimizer`` (state sharded over the
DP ranks, ``distributed_optimizer.MegatronDistributedOptimizer``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket

import torch
import torch.distributed as dist

from ringzero.engines.builders import fresh_model
from ringzero.engines.training import TrainingSetup
from ringzero.errors import RingzeroError
from ringzero.model.config import PrecisionPolicy
from ringzero.parallel.runtime import Runtime

INSTALL_HINT = (
    "megatron-core is not installed: `pip install 'ringzero[gpu]'` on a CUDA machine, or "
    "`pip install megatron-core==0.16.1` (it runs on the CPU behind ringzero.engines.megatron.cpu_shim)"
)


def require_megatron() -> None:
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise RingzeroError(f"engines.training.kind megatron: {INSTALL_HINT}") from exc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join(runtime: Runtime, tp: int, ep: int = 1, pp: int = 1) -> None:
    """megatron-core's parallel state for this job (once per process)."""
    from megatron.core import parallel_state

    from ringzero.engines.megatron import cpu_shim

    cpu_shim.apply()
    dims = runtime.dims
    if dims.tp != tp:
        raise RingzeroError(f"engines.training.tp is {tp} but the job was laid out with tp {dims.tp}")
    if dims.pp != pp:
        raise RingzeroError(f"engines.training.pp is {pp} but the job was laid out with pp {dims.pp}")
    if dims.ep not in (1, ep):
        raise RingzeroError(f"engines.training.ep is {ep} but the job was laid out with ep {dims.ep}")
    if (dims.dp * dims.cp) % ep:
        raise RingzeroError(
            f"engines.training.ep: {ep} does not divide parallel.dp x parallel.cp "
            f"({dims.dp * dims.cp}): expert-parallel ranks are carved out of those ranks"
        )
    if not dist.is_initialized():
        if runtime.world_size > 1:
            raise RingzeroError(
                "a job of several ranks must join torch.distributed before the megatron engine"
            )
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_context_parallel_world_size(),
            parallel_state.get_expert_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tp, dims.cp, ep, pp):
            raise RingzeroError(
                f"megatron-core was initialized with tensor parallel {have[0]}, context parallel "
                f"{have[1]}, expert parallel {have[2]} and pipeline parallel {have[3]} in this "
                f"process; this stage asks for {tp}, {dims.cp}, {ep} and {pp}"
            )
        return
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        context_parallel_size=dims.cp,
        expert_model_parallel_size=ep,
        pipeline_model_parallel_size=pp,
    )
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(1234)
    rank = runtime.rank
    mine = parallel_state.get_tensor_model_parallel_rank()
    if tp > 1 and mine != dims.tp_index(rank):
        raise RingzeroError(
            f"megatron-core puts rank {rank} at TP index {mine}, ringzero's layout at {dims.tp_index(rank)}"
        )
    if dims.cp > 1 and parallel_state.get_context_parallel_rank() != runtime.cp_rank:
        raise RingzeroError(
            f"megatron-core puts rank {rank} at CP index {parallel_state.get_context_parallel_rank()}, "
            f"ringzero's layout at {runtime.cp_rank}"
        )
    if pp > 1 and parallel_state.get_pipeline_model_parallel_rank() != dims.pp_index(rank):
        raise RingzeroError(
            f"megatron-core puts rank {rank} at pipeline stage "
            f"{parallel_state.get_pipeline_model_parallel_rank()}, ringzero's layout at "
            f"{dims.pp_index(rank)}"
        )
    if ep > 1:
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        edp = dist.get_process_group_ranks(parallel_state.get_expert_data_parallel_group())
        laid = dataclasses.replace(dims, ep=ep)  # the runtime may carry ep 1 (it does not change the world)
        want = laid.expert_dp_ranks(rank)
        if ep_rank != laid.ep_index(rank) or sorted(edp) != want:
            raise RingzeroError(
                f"megatron-core puts rank {rank} at expert shard {ep_rank} with expert-data-parallel "
                f"ranks {sorted(edp)}; ringzero's layout expects shard {laid.ep_index(rank)} "
                f"with {want}"
            )


class MegatronEngine:
    kind = "megatron"

    def __init__(self, settings):
        self.settings = settings  # engines.training

    def _model(self, cfg, store, uri, policy: PrecisionPolicy, runtime: Runtime):
        """This rank's ``MegatronLM`` shard (parameters allocated at their shard's size, not initialized) and
        the weights to load into it: a checkpoint streamed a layer at a time, this stage's shard files only
        (``streamed.stage_state``), or without ``uri`` a fresh fp32 ``HybridLM`` state (drawn whole and
        seeded, so both engines start from the same weights; a cluster run starts from a checkpoint)."""
        require_megatron()
        join(runtime, self.settings.tp, self.settings.ep, self.settings.pp)
        from ringzero.engines.megatron.model import MegatronLM
        from ringzero.engines.megatron.streamed import stage_state

        on_gpu = runtime.device.type == "cuda"
        with (
            torch.cuda.device(runtime.device) if on_gpu else contextlib.nullcontext()
        ):  # megatron allocates there
            model = MegatronLM(cfg.model, policy, runtime.device).to(runtime.device)
        if uri is None:
            return model, fresh_model(cfg, PrecisionPolicy.preset("fp32")).state_dict()
        # full fp32 values at the masters: the checkpoint's, not their cast to the body dtype
        return model, stage_state(store, uri, cfg.model, model.stage)

    def build(self, cfg, store, init_uri, policy, runtime, *, optim, total_steps, schedule) -> TrainingSetup:
        model, state = self._model(cfg, store, init_uri, policy, runtime)
        if self.settings.distributed_optimizer:
            from ringzero.engines.megatron.distributed_optimizer import MegatronDistributedOptimizer

            optimizer = MegatronDistributedOptimizer(model, optim, total_steps, schedule)
        else:
            from ringzero.engines.megatron.optimizer import ShardedTrainOptimizer

            optimizer = ShardedTrainOptimizer(model, optim, total_steps, schedule)
        optimizer.load_weights(state, source=init_uri or "a fresh model")
        # No rank ever held the full model from a checkpoint, and a fresh model's full state is dropped here:
        # each rank keeps its shards and their optimizer state only; a serving copy is built when something
        # samples or evaluates in-process (TrainingSetup.served).
        del state
        return TrainingSetup(model.train(), optimizer, None, cfg=cfg.model, device=runtime.device)

    def frozen(self, cfg, store, uri, policy, runtime):
        from ringzero.engines.megatron.convert import load_hybrid_state_

        model, state = self._model(cfg, store, uri, policy, runtime)
        load_hybrid_state_(
            model, state, source=uri or "a fresh model"
        )  # the MoE routing biases (buffers) too
        for p in model.parameters():
            p.requires_grad_(False)
        return model.eval()
