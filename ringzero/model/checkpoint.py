"""Model checkpoints through the checkpoint store, in the Ling 2.5 format (``ringzero.model.hf_format``).

A committed model checkpoint is a Hugging Face model folder of ``BailingMoeV2_5ForCausalLM``: weights
under the reference's tensor names, ``config.json`` with the Ling 2.5 keys, ``generation_config.json``
and, when a tokenizer is given, ``tokenizer.json`` + ``tokenizer_config.json``. Loading rebuilds the
model from ``config.json`` and refuses weights that do not fit it, naming every tensor at fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch

from ringzero.errors import RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hf_format import (
    generation_config,
    hf_config,
    hf_tensors,
    model_config_from_hf,
    state_dict_from_hf,
)
from ringzero.model.hybrid import HybridLM

GENERATION_CONFIG = "generation_config.json"


def checkpoint_parts(
    cfg: ModelConfig, state_dict: dict[str, torch.Tensor], tokenizer=None, dtype: torch.dtype | None = None
):
    """``(tensors, config, extra_files)`` of a Ling 2.5 folder holding ``state_dict`` (cast to ``dtype``)."""
    from ringzero.tokenizer.export import special_tokens, tokenizer_files

    # The MoE routing bias stays in at least fp32 whatever the stored dtype: rounded, it can flip which
    # expert wins (SGLang keeps it fp32 too).
    def stored(name: str, v: torch.Tensor) -> torch.dtype:
        if not v.is_floating_point() or dtype is None:
            return v.dtype
        return torch.promote_types(dtype, torch.float32) if name.endswith("expert_bias") else dtype

    tensors = {
        k: v.detach().to("cpu", dtype=stored(k, v)).contiguous() for k, v in hf_tensors(state_dict).items()
    }
    stored = dtype or next(v.dtype for v in tensors.values() if v.is_floating_point())
    specials = special_tokens(tokenizer) if tokenizer is not None else None
    extra = {GENERATION_CONFIG: json.dumps(generation_config(specials), indent=2).encode()}
    if tokenizer is not None:
        extra.update(tokenizer_files(tokenizer))
    return tensors, hf_config(cfg, stored, specials), extra


def save_model(
    store,
    name: str,
    model: HybridLM,
    cfg: ModelConfig | None = None,
    meta: dict | None = None,
    tokenizer=None,
) -> str:
    """Write ``model`` as checkpoint ``name``; returns the committed URI. ``cfg`` defaults to
    ``model.cfg``."""
    cfg = cfg or model.cfg
    if cfg != model.cfg:
        raise RingzeroError(f"save_model({name!r}): the config given differs from the model's own config")
    return save_state(store, name, cfg, model.state_dict(), meta, tokenizer)


def save_state(
    store,
    name: str,
    cfg: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    meta: dict | None = None,
    tokenizer=None,
    dtype: torch.dtype | None = torch.float32,
) -> str:
    """Commit ``state_dict`` (a ``HybridLM``'s keys) as the Ling 2.5 checkpoint ``name``. An empty one is only
    for a store whose writes are rank 0's (``drops_writes`` on the other ranks)."""
    if not state_dict and not getattr(store, "drops_writes", False):
        raise RingzeroError(f"save_state({name!r}): no tensors to write")
    tensors, config, extra = checkpoint_parts(cfg, state_dict, tokenizer, dtype)
    return store.save(name, tensors, config, meta, extra_files=extra)


@dataclass
class LoadedModel:
    model: HybridLM
    config: ModelConfig
    uri: str
    meta: dict[str, Any] = field(default_factory=dict)


def model_config_from(config: dict, source: str) -> ModelConfig:
    """The ``ModelConfig`` of a checkpoint's ``config.json``."""
    return model_config_from_hf(config, source)


def expected_shapes(model: HybridLM) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_tensors(model: HybridLM, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Raise naming every missing, unexpected or mis-shaped tensor of a state dict (ringzero's own keys)."""
    expected = expected_shapes(model)
    problems = [f"missing tensor {k} (shape {list(s)})" for k, s in expected.items() if k not in tensors]
    problems += [f"unexpected tensor {k}" for k in tensors if k not in expected]
    problems += [
        f"tensor {k} has shape {list(tensors[k].shape)}, the config needs {list(s)}"
        for k, s in expected.items()
        if k in tensors and tuple(tensors[k].shape) != s
    ]
    if problems:
        raise RingzeroError(f"{source}: weights do not match the model: " + "; ".join(problems))


def state_dict_of(model: HybridLM, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as ``model``'s state dict, refusing what does not fit (named)."""
    return state_dict_from_hf(tensors, expected_shapes(model), source, model.cfg.num_hidden_layers)


def _open(source, store, s3):
    if hasattr(source, "tensors") and hasattr(source, "config"):
        return source
    if not isinstance(source, str):
        raise RingzeroError(
            f"load_model: expected a URI, a checkpoint name or a loaded checkpoint, got {source!r}"
        )
    if store is not None:
        return store.load(source)
    if "://" not in source:
        raise RingzeroError(f"load_model: {source!r} is a name; pass the store that holds it, or a full URI")
    from ringzero.store import load_checkpoint

    return load_checkpoint(source, s3)


def build_loaded(
    config: dict,
    tensors: dict[str, torch.Tensor],
    where: str,
    policy: PrecisionPolicy | None,
    device,
    meta: dict | None = None,
) -> LoadedModel:
    cfg = model_config_from(dict(config), where)
    model = HybridLM(cfg, policy or PrecisionPolicy())
    model.load_state_dict(state_dict_of(model, tensors, where), strict=True)
    return LoadedModel(model.to(device), cfg, where, dict(meta or {}))


def load_model(
    source, policy: PrecisionPolicy | None = None, *, store=None, s3=None, device: str | torch.device = "cpu"
) -> LoadedModel:
    """Rebuild a ``HybridLM`` from a checkpoint URI, a name in ``store``, or a loaded checkpoint object.

    Weights are cast to ``policy``'s body dtype (default: the ``fp32-islands`` policy).
    """
    ckpt = _open(source, store, s3)
    where = getattr(ckpt, "uri", None) or str(source)
    return build_loaded(ckpt.config, ckpt.tensors, where, policy, device, getattr(ckpt, "meta", None))
