"""Micro-batches through a pipeline-parallel ``MegatronLM``: megatron-core's 1F1B schedule.

``Pipeline.run(micro_batches, backward)`` hands megatron's
``forward_backward_pipelining_without_interleaving`` a forward step per micro-batch: every stage runs its
layers (``MegatronLM.stage_forward``; the first from the token ids, the others from the activations the
schedule received from the stage before), and on the last stage the schedule calls the micro-batch's ``head``
with the final hidden states: the LM head, the per-token log-probs, entropy and loss are computed there and
nowhere else. The loss goes back through the stages as megatron's schedule sends gradients (warm-up forwards,
then one forward one backward, then the cool-down backwards), so at most ``pp - stage`` micro-batches'
activations are alive on a stage.

The schedule neither divides nor scales the loss (``calculate_per_token_loss`` in the model's config):
each head's loss already carries the global denominator, as in the sequential path. Each stage receives
its micro-batch's shape first (``variable_seq_lengths``): rows are right-padded per micro-batch.

Returns the heads' records on the last stage and ``None`` for each micro-batch elsewhere; callers sum
per-token values over ``Runtime.sum_``, whose group spans the stages, so every rank ends with them.
"""

from __future__ import annotations

import torch

from ringzero.errors import RingzeroError


class Pipeline:
    def __init__(self, model):
        self.model = model

    def run(self, micro_batches: list, *, backward: bool) -> list:
        from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

        from ringzero.engines.megatron import cpu_shim

        cpu_shim.apply_pipeline()
        if any(mb.context is not None for mb in micro_batches):
            raise RingzeroError(
                "a micro-batch context (routing replay) under pipeline parallelism: each stage routes "
                "its own layers, and replaying them is not implemented; use engines.training.pp: 1"
            )
        if not micro_batches:
            return []
        records: list = [None] * len(micro_batches)
        model = self.model

        def forward_step(data_iterator, _model):
            i, mb = next(data_iterator)
            out_SBD = model.stage_forward(mb.shard.inputs_BS, mb.shard.positions_BS)

            def loss_func(hidden_SBD):
                loss, records[i] = mb.head(hidden_SBD.transpose(0, 1))
                if loss is None:  # scoring only: the schedule still wants a scalar
                    loss = hidden_SBD.new_zeros(())
                # (loss, tokens, reduced): with calculate_per_token_loss the schedule leaves the loss as is
                return loss, torch.ones((), dtype=torch.int), {}

            return out_SBD, loss_func

        widest = max(mb.shard.inputs_BS.shape[1] for mb in micro_batches)
        rows = max(mb.shard.inputs_BS.shape[0] for mb in micro_batches)
        forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step,
            data_iterator=iter(enumerate(micro_batches)),
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=widest * model.cp_size,
            micro_batch_size=rows,
            forward_only=not backward,
        )
        return records
