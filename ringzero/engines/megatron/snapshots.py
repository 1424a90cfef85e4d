"""A rank's own training state on the host and back, bit for bit, with no collective: what the rollback
guard snapshots under the megatron engine (``local_snapshot`` / ``restore_local`` of both optimizers).

Held: the model's parameters (body dtype) and routing biases, then per torch optimizer (ringzero's AdamW
over the fp32 masters, or each of megatron's over its main-parameter shards) every parameter it steps,
its per-parameter state, and each group's settings but its parameters (Transformer Engine's FusedAdam,
megatron's choice where TE imports, counts its steps there, not per parameter). Adam's per-parameter step
count goes back where torch's AdamW keeps it, on the host.
"""

from __future__ import annotations

import torch

from ringzero.engines.megatron.convert import routing_buffers


def _host(v):
    return v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v


def _stepped(optimizer) -> list[torch.Tensor]:
    return [m for group in optimizer.param_groups for m in group["params"]]


def snapshot(model, params: list[torch.Tensor], optimizers: list) -> dict:
    """Host copies of ``model``'s ``params`` and routing biases and of ``optimizers``' state."""
    model_params = {id(p) for p in params}
    return {
        "params": [_host(p) for p in params],
        "buffers": {n: _host(b) for n, b in routing_buffers(model).items()},
        # a parameter an optimizer steps in place (fp32 training: no separate master) is not copied twice
        "stepped": [
            [None if id(m) in model_params else _host(m) for m in _stepped(opt)] for opt in optimizers
        ],
        "state": [
            [
                {k: _host(v) for k, v in opt.state[m].items()} if m in opt.state else None
                for m in _stepped(opt)
            ]
            for opt in optimizers
        ],
        "groups": [
            [{k: _host(v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
            for opt in optimizers
        ],
    }


@torch.no_grad()
def restore(model, params: list[torch.Tensor], optimizers: list, snap: dict) -> None:
    """Put ``snapshot``'s values back into the same tensors and optimizers."""
    for p, v in zip(params, snap["params"], strict=True):
        p.copy_(v)
    for name, b in routing_buffers(model).items():
        b.copy_(snap["buffers"][name])
    for opt, stepped, states, groups in zip(
        optimizers, snap["stepped"], snap["state"], snap["groups"], strict=True
    ):
        for group, saved in zip(opt.param_groups, groups, strict=True):
            group.update({k: v.clone() if torch.is_tensor(v) else v for k, v in saved.items()})
        opt.state.clear()
        for m, value, slots in zip(_stepped(opt), stepped, states, strict=True):
            if value is not None:
                m.copy_(value)
            if slots is not None:
                opt.state[m] = {
                    k: (v.clone() if k == "step" else v.to(m.device).clone()) if torch.is_tensor(v) else v
                    for k, v in slots.items()
                }
