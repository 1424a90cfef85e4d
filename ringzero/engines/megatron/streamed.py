"""A committed checkpoint read into a ``MegatronLM`` rank a layer at a time, never whole.

``stage_state(store, uri, cfg, stage)`` yields groups of full ``HybridLM`` tensors that each convert on
their own (``convert.to_megatron``): every tensor of one layer (the fused MLP and the per-head RoPE rows
need their layer's tensors together), or one tensor outside the layers (embedding, final norm, head).
Only the shard files that hold this pipeline stage's tensors are read (``CheckpointStore.iter_tensors``:
each verified by size and sha256), and a group is handed on, then dropped, as soon as its last tensor
arrives; so a rank holds its own shards plus at most the layers whose tensors one shard file spreads over,
not the model. The whole checkpoint's names are checked first against the model's (from the manifest,
nothing read: a missing or unexpected tensor is refused before any work), each read tensor's shape as it
arrives. The shapes come from a ``HybridLM`` built on the meta device (no storage).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import torch

from ringzero.engines.megatron.convert import StageLayers, group_of
from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import expected_shapes, model_config_from
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hf_format import state_dict_from_hf
from ringzero.model.hybrid import HybridLM


def _held(key: str, stage: StageLayers) -> bool:
    parts = key.split(".")
    if parts[0] == "layers":
        return stage.first <= int(parts[1]) < stage.first + stage.count
    if parts[0] == "word_embeddings":
        return stage.has_embedding
    return stage.has_head  # norm, lm_head


def open_checkpoint(store, uri: str):
    """``(checkpoint store, name)`` of ``uri``: in ``store`` when it is under it, else its parent folder."""
    from ringzero.store import open_store
    from ringzero.store.uri import parse_uri

    if store is not None:
        try:
            return store, store.name_of(uri)
        except RingzeroError:
            pass
    if "://" not in uri:
        raise RingzeroError(f"{uri!r} is a name; pass the store that holds it, or a full URI")
    root, name = parse_uri(uri).parent()
    return open_store(str(root)), name


def stage_state(store, uri: str, cfg: ModelConfig, stage: StageLayers) -> Iterator[dict[str, torch.Tensor]]:
    ckpt, name = open_checkpoint(store, uri)
    config = model_config_from(json.loads(ckpt.read_file(name, "config.json")), uri)
    if config != cfg:
        raise RingzeroError(f"{uri}: its model config differs from this run's model section")
    with torch.device("meta"):
        expected = expected_shapes(HybridLM(cfg, PrecisionPolicy.preset("fp32")))
    # the names alone, through the one check every load uses (meta tensors: nothing is read)
    names = ckpt.tensor_names(name)
    keys = state_dict_from_hf(
        {n: torch.empty(expected.get(_key(n), (0,)), device="meta") for n in names},
        expected,
        uri,
        cfg.num_hidden_layers,
    )
    # under the file's own names (with or without ``model.``, as the check accepts them)
    wanted = {n: _key(n) for n in names if _key(n) in keys and _held(_key(n), stage)}
    need: dict[str, int] = {}
    for key in wanted.values():
        need[group_of(key)] = need.get(group_of(key), 0) + 1
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for part in ckpt.iter_tensors(name, lambda n: n in wanted):
        for hf, t in part.items():
            key = wanted[hf]
            if tuple(t.shape) != tuple(expected[key]):
                raise RingzeroError(
                    f"{uri}: weights do not match config.json: tensor {hf} has shape "
                    f"{list(t.shape)}, the config needs {list(expected[key])}"
                )
            group = pending.setdefault(group_of(key), {})
            group[key] = t
            if len(group) == need[group_of(key)]:
                yield pending.pop(group_of(key))
    if pending:  # cannot happen after the name check, unless the manifest lied
        raise RingzeroError(f"{uri}: incomplete layers after reading every shard: {sorted(pending)[:5]}")


def _key(hf: str) -> str:
    return hf[len("model.") :] if hf.startswith("model.") else hf
