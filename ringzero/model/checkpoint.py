"""Model checkpoints through the checkpoint store: safetensors weights plus an HF-style ``config.json``.

``config.json`` carries the usual Hugging Face keys (derived, for tools that read them) and the full
``ModelConfig`` under ``ringzero_model``, which is what loading trusts. Loading rebuilds the model from
that config and refuses weights that do not fit it, naming every tensor at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import ValidationError

from ringzero.errors import ConfigError, RingzeroError
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.precision import dtype_name

ARCHITECTURE = "RingzeroHybridLM"
FORMAT_VERSION = 1


def hf_config(cfg: ModelConfig, dtype: torch.dtype) -> dict:
    """The ``config.json`` of a checkpoint of ``cfg`` whose tensors are stored in ``dtype``."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "ringzero_hybrid",
        "torch_dtype": dtype_name(dtype),
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.mlp_hidden,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tie_embeddings,
        "layer_types": ["full_attention" if t == "mla" else "linear_attention" for t in cfg.layer_types()],
        "q_lora_rank": cfg.mla.q_lora_rank,
        "kv_lora_rank": cfg.mla.kv_lora_rank,
        "qk_nope_head_dim": cfg.mla.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.mla.qk_rope_head_dim,
        "v_head_dim": cfg.mla.v_head_dim,
        "rope_theta": cfg.mla.rope_theta,
        "linear_attn_head_dim": cfg.lightning.head_dim,
        "block_size": cfg.lightning.block_size,
        "ringzero_format": FORMAT_VERSION,
        "ringzero_model": cfg.model_dump(mode="json"),
    }


def save_model(store, name: str, model: HybridLM, cfg: ModelConfig | None = None,
               meta: dict | None = None) -> str:
    """Write ``model`` as checkpoint ``name``; returns the committed URI. ``cfg`` defaults to ``model.cfg``."""
    cfg = cfg or model.cfg
    if cfg != model.cfg:
        raise RingzeroError(f"save_model({name!r}): the config given differs from the model's own config")
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    dtype = next(iter(tensors.values())).dtype
    return store.save(name, tensors, hf_config(cfg, dtype), meta)


@dataclass
class LoadedModel:
    model: HybridLM
    config: ModelConfig
    uri: str
    meta: dict[str, Any] = field(default_factory=dict)


def model_config_from(config: dict, source: str) -> ModelConfig:
    """The ``ModelConfig`` stored in a checkpoint's ``config.json``, checked against its HF keys."""
    if config.get("ringzero_format") != FORMAT_VERSION or "ringzero_model" not in config:
        raise RingzeroError(
            f"{source}: config.json is not a ringzero model checkpoint "
            f"(ringzero_format={config.get('ringzero_format')!r}, expected {FORMAT_VERSION})"
        )
    try:
        cfg = ModelConfig.model_validate(config["ringzero_model"])
    except ValidationError as exc:
        problems = [f"ringzero_model.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(f"{source} config.json", problems) from None
    derived = hf_config(cfg, torch.float32)
    stale = [k for k, v in derived.items() if k != "torch_dtype" and k in config and config[k] != v]
    if stale:
        raise RingzeroError(
            f"{source}: config.json disagrees with its ringzero_model section on "
            + ", ".join(f"{k} ({config[k]!r} vs {derived[k]!r})" for k in stale)
        )
    return cfg


def check_tensors(model: HybridLM, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Raise naming every missing, unexpected or mis-shaped tensor."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    problems = [f"missing tensor {k} (shape {list(s)})" for k, s in expected.items() if k not in tensors]
    problems += [f"unexpected tensor {k}" for k in tensors if k not in expected]
    problems += [
        f"tensor {k} has shape {list(tensors[k].shape)}, the config needs {list(s)}"
        for k, s in expected.items() if k in tensors and tuple(tensors[k].shape) != s
    ]
    if problems:
        raise RingzeroError(f"{source}: weights do not match config.json: " + "; ".join(problems))


def _open(source, store, s3):
    if hasattr(source, "tensors") and hasattr(source, "config"):
        return source
    if not isinstance(source, str):
        raise RingzeroError(f"load_model: expected a URI, a checkpoint name or a loaded checkpoint, got {source!r}")
    if store is not None:
        return store.load(source)
    if "://" not in source:
        raise RingzeroError(f"load_model: {source!r} is a name; pass the store that holds it, or a full URI")
    from ringzero.store import load_checkpoint

    return load_checkpoint(source, s3)


def load_model(source, policy: PrecisionPolicy | None = None, *, store=None, s3=None,
               device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild a ``HybridLM`` from a checkpoint URI, a name in ``store``, or a loaded checkpoint object.

    Weights are cast to ``policy``'s body dtype (default: the ``fp32-islands`` policy).
    """
    ckpt = _open(source, store, s3)
    where = getattr(ckpt, "uri", None) or str(source)
    cfg = model_config_from(dict(ckpt.config), where)
    model = HybridLM(cfg, policy or PrecisionPolicy())
    check_tensors(model, ckpt.tensors, where)
    model.load_state_dict(dict(ckpt.tensors), strict=True)
    return LoadedModel(model.to(device), cfg, where, dict(getattr(ckpt, "meta", None) or {}))
