"""The Ling 2.5 / Ring 2.5 checkpoint format: ``config.json`` keys and tensor names of
``BailingMoeV2_5ForCausalLM``, the architecture the HF reference and SGLang load.

A ringzero checkpoint is such a folder: ``config.json`` (``hf_config``), safetensors under the
reference's tensor names (``hf_tensors``: a state-dict key prefixed with ``model.``, except ``lm_head``),
``generation_config.json`` and the tokenizer files. Reading goes the other way (``model_config_from_hf``,
``state_dict_from_hf``) and refuses, naming the key or tensor, what does not fit.

Two writing choices keep one folder meaning the same model to both loaders:
- a dense model is written as ``num_experts: 1`` with ``first_k_dense_replace = num_hidden_layers``:
  the HF reference builds dense MLPs below ``first_k_dense_replace``, and SGLang builds dense MLPs when
  ``num_experts == 1`` (it cannot load ``num_experts: null``: its expert mapping ranges over it);
- ``model_type`` is ``bailing_hybrid``, the config class SGLang registers for this architecture.
ringzero's own fields (``layout``, ``lightning_block_size``, ``mla_attention_impl``) travel under the
``ringzero`` key, which both loaders ignore.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import ValidationError

from ringzero.errors import ConfigError, RingzeroError
from ringzero.model.config import ModelConfig
from ringzero.model.precision import dtype_name

ARCHITECTURE = "BailingMoeV2_5ForCausalLM"
MODEL_TYPE = "bailing_hybrid"
KNOWN_MODEL_TYPES = ("bailing_hybrid", "bailing_moe_v2_5", "bailing_moe_linear")
LEGACY_ARCHITECTURE = "RingzeroHybridLM"
OWN_FIELDS = ("layout", "lightning_block_size", "mla_attention_impl")
# Reference keys read back into ModelConfig (everything else in config.json is derived or informative).
LING_FIELDS = tuple(k for k in ModelConfig.model_fields if k not in OWN_FIELDS)
# Keys the reference defines that ringzero only accepts at one value: key -> (accepted, reason).
FIXED_KEYS = {
    "hidden_act": ("silu", "the MLPs are SwiGLU"),
    "linear_silu": (False, "SiLU on the Lightning q/k/v is not implemented"),
    "full_attention_type": ("mla", "the full-attention layers are MLA"),
}


def hf_config(
    cfg: ModelConfig, dtype: torch.dtype, special_tokens: Mapping[str, int | None] | None = None
) -> dict:
    """``config.json`` of a checkpoint of ``cfg`` whose tensors are stored in ``dtype``."""
    doc = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "torch_dtype": dtype_name(dtype)}
    doc.update(cfg.model_dump(mode="json", include=set(LING_FIELDS)))
    if cfg.num_experts is None:
        doc.update(num_experts=1, first_k_dense_replace=cfg.num_hidden_layers)
    elif cfg.num_shared_experts is None:  # the same (none), written so SGLang's `> 0` test can read it
        doc["num_shared_experts"] = 0
    doc.update(
        num_key_value_heads=cfg.num_attention_heads,
        hidden_act="silu",
        linear_silu=False,
        num_nextn_predict_layers=0,
        full_attention_type="mla",
        scoring_func=cfg.score_function,
        topk_method="noaux_tc",
        use_cache=True,
    )
    doc.update({k: v for k, v in (special_tokens or {}).items() if v is not None})
    doc["ringzero"] = cfg.model_dump(mode="json", include=set(OWN_FIELDS))
    return doc


def generation_config(special_tokens: Mapping[str, int | None] | None = None) -> dict:
    """``generation_config.json``: the token ids a generator needs, nothing that changes sampling."""
    doc = {"_from_model_config": True}
    doc.update({k: v for k, v in (special_tokens or {}).items() if v is not None})
    return doc


def _refuse_legacy(config: Mapping, source: str) -> None:
    if config.get("ringzero_format") is not None or LEGACY_ARCHITECTURE in (
        config.get("architectures") or []
    ):
        raise RingzeroError(
            f"{source}: a checkpoint in ringzero's earlier format ({LEGACY_ARCHITECTURE}), which no other "
            f"software loads; convert it once with `ringzero convert {source} --to NEW_URI` (it rewrites the "
            f"weights under the Ling 2.5 names) and use the new URI"
        )


def model_config_from_hf(config: Mapping, source: str) -> ModelConfig:
    """The ``ModelConfig`` of a Ling 2.5 ``config.json``, refusing what it cannot honour, naming the key."""
    _refuse_legacy(config, source)
    archs = config.get("architectures") or []
    if ARCHITECTURE not in archs:
        raise RingzeroError(
            f"{source}: config.json architectures is {archs!r}; ringzero loads {ARCHITECTURE!r} "
            f"(Ling 2.5 / Ring 2.5) checkpoints only"
        )
    problems = [
        f"{k} is {config[k]!r}: only {want!r} is supported ({why})"
        for k, (want, why) in FIXED_KEYS.items()
        if k in config and config[k] != want
    ]
    if config.get("model_type") not in (None, *KNOWN_MODEL_TYPES):
        problems.append(f"model_type is {config['model_type']!r}, expected one of {list(KNOWN_MODEL_TYPES)}")
    heads = config.get("num_attention_heads")
    if config.get("num_key_value_heads") not in (None, heads):
        problems.append(
            f"num_key_value_heads ({config['num_key_value_heads']}) must equal num_attention_heads "
            f"({heads}): the Lightning and MLA layers have one key per query head"
        )
    fields = {k: config[k] for k in LING_FIELDS if k in config}
    fields.update(dict(config.get("ringzero") or {}))
    layers = fields.get("num_hidden_layers")
    if fields.get("num_experts") == 1:
        if layers is not None and fields.get("first_k_dense_replace", 0) < layers:
            problems.append(
                "num_experts is 1 with MoE layers from first_k_dense_replace on: the HF reference "
                "builds a one-expert MoE there and SGLang a dense MLP, so the folder means two models"
            )
        fields["num_experts"] = None
        fields["first_k_dense_replace"] = 0
    try:
        cfg = ModelConfig.model_validate(fields)
    except ValidationError as exc:
        problems += [f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors()]
    if problems:
        raise ConfigError(f"{source} config.json", problems)
    return cfg


def hf_name(key: str) -> str:
    return key if key.startswith("lm_head.") else f"model.{key}"


def hf_tensors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ``HybridLM`` state dict under the reference's tensor names."""
    return {hf_name(k): v for k, v in state_dict.items()}


def state_dict_from_hf(
    tensors: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple],
    source: str,
    num_hidden_layers: int | None = None,
) -> dict[str, torch.Tensor]:
    """Tensors of a Ling 2.5 folder as a ``HybridLM`` state dict; ``expected`` maps state-dict keys to shapes.

    Refuses, naming every tensor at fault, a missing, unexpected or mis-shaped tensor. The
    multi-token-prediction layers of a published checkpoint (``model.layers.{i}`` with
    ``i >= num_hidden_layers``, or ``model.mtp.*``; ``num_nextn_predict_layers`` in its config) and the
    rotary ``inv_freq`` buffers some exports carry are dropped: ringzero trains no MTP head and writes
    ``num_nextn_predict_layers: 0``.
    """
    out, unexpected = {}, []
    for name, t in tensors.items():
        if (
            name.endswith(".inv_freq")
            or name.startswith("model.mtp.")
            or (num_hidden_layers is not None and _mtp_layer(name, num_hidden_layers))
        ):
            continue
        key = name[len("model.") :] if name.startswith("model.") else name
        (out.__setitem__(key, t) if key in expected else unexpected.append(name))
    problems = [f"missing tensor {hf_name(k)} (shape {list(s)})" for k, s in expected.items() if k not in out]
    problems += [f"unexpected tensor {n}" for n in unexpected]
    problems += [
        f"tensor {hf_name(k)} has shape {list(out[k].shape)}, the config needs {list(s)}"
        for k, s in expected.items()
        if k in out and tuple(out[k].shape) != tuple(s)
    ]
    if problems:
        raise RingzeroError(f"{source}: weights do not match config.json: " + "; ".join(problems))
    return out


def _mtp_layer(name: str, num_hidden_layers: int) -> bool:
    parts = name.split(".")
    return (
        len(parts) > 2
        and parts[:2] == ["model", "layers"]
        and parts[2].isdigit()
        and int(parts[2]) >= num_hidden_layers
    )
