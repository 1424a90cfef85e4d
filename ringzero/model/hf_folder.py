"""Local Ling 2.5 model folders: what ``ringzero export`` writes, ``ringzero import`` checks and
``ringzero serve --model-path`` loads.

A folder is read the way transformers and SGLang read it: ``config.json``, then either
``model.safetensors`` or the shards ``model.safetensors.index.json`` names. Checking a folder against its
config reads only the safetensors headers, so a large downloaded checkpoint is validated before a byte
of it is copied. Writing goes through a scratch local store and its ``export_folder``: one writer of
the format, with its checksums and its all-or-nothing rename.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from ringzero.errors import RingzeroError
from ringzero.model.checkpoint import LoadedModel, build_loaded, checkpoint_parts, expected_shapes
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hf_format import model_config_from_hf, state_dict_from_hf
from ringzero.store.layout import INDEX_FILE, SINGLE_SHARD_FILE, parse_index


def read_config(path: str | Path) -> dict:
    folder = Path(path)
    cfg_file = folder / "config.json"
    if not folder.is_dir():
        raise RingzeroError(f"{folder}: not a folder")
    if not cfg_file.is_file():
        raise RingzeroError(f"{folder}: no config.json (not a Hugging Face model folder)")
    try:
        doc = json.loads(cfg_file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise RingzeroError(f"{cfg_file}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RingzeroError(f"{cfg_file}: expected a JSON object")
    return doc


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a folder, from its index when there is one."""
    folder = Path(path)
    index = folder / INDEX_FILE
    if index.is_file():
        names = sorted(set(parse_index(index.read_bytes(), str(index), RingzeroError).values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise RingzeroError(f"{index} names shard(s) that are not in the folder: {missing}")
        return [folder / n for n in names]
    if (folder / SINGLE_SHARD_FILE).is_file():
        return [folder / SINGLE_SHARD_FILE]
    raise RingzeroError(f"{folder}: no {SINGLE_SHARD_FILE} and no {INDEX_FILE}")


def _open_all(path: str | Path, fn) -> dict:
    from safetensors import safe_open

    out: dict = {}
    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name in out:
                        raise RingzeroError(f"{path}: tensor {name} is in two weight files")
                    out[name] = fn(f, name)
        except RingzeroError:
            raise
        except Exception as exc:  # safetensors raises its own error types for torn or foreign files
            raise RingzeroError(f"{file}: not a readable safetensors file: {exc}") from None
    return out


def check_folder(path: str | Path) -> ModelConfig:
    """The folder's ``ModelConfig``, after checking every tensor's name and shape against it (headers only)."""
    from ringzero.model.hybrid import HybridLM

    cfg = model_config_from_hf(read_config(path), str(path))
    shapes = _open_all(path, lambda f, name: f.get_slice(name).get_shape())
    with torch.device("meta"):
        model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    placeholders = {n: torch.empty(s, device="meta") for n, s in shapes.items()}
    state_dict_from_hf(placeholders, expected_shapes(model), str(path), cfg.num_hidden_layers)
    return cfg


def load_folder(path: str | Path, policy: PrecisionPolicy | None = None, device="cpu") -> LoadedModel:
    """Rebuild a ``HybridLM`` from a local Ling 2.5 folder."""
    config = read_config(path)
    model_config_from_hf(config, str(path))  # refuse a foreign folder before reading its weights
    tensors = _open_all(path, lambda f, name: f.get_tensor(name))
    return build_loaded(config, tensors, str(Path(path).absolute()), policy, device)


def write_folder(path: str | Path, cfg: ModelConfig, state_dict: dict[str, torch.Tensor], tokenizer=None,
                 dtype: torch.dtype | None = torch.float32) -> list[str]:
    """Write ``state_dict`` as the Ling 2.5 folder ``path`` (which must not exist or be empty)."""
    from ringzero.store import CheckpointStore
    from ringzero.store.local import LocalBackend

    tensors, config, extra = checkpoint_parts(cfg, state_dict, tokenizer, dtype)
    with tempfile.TemporaryDirectory(prefix=".ringzero-export-", dir=Path(path).absolute().parent) as scratch:
        store = CheckpointStore(LocalBackend(scratch))
        store.save("export", tensors, config, extra_files=extra)
        return store.export_folder("export", path)
