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
        doc = json.loads(cfg_file.read_bytes())
    except RecursionError:
        raise RingzeroError(f"{cfg_file}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError alike
        raise RingzeroError(f"{cfg_file}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RingzeroError(f"{cfg_file}: expected a JSON object")
    problems = []
    archs = doc.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        problems.append(f"architectures must be a list of class names (got {archs!r:.80})")
    if not isinstance(doc.get("ringzero"), dict | None):
        problems.append(f"ringzero must be an object of ModelConfig fields (got {doc['ringzero']!r:.80})")
    for key in (
        "num_hidden_layers",
        "num_experts",
        "first_k_dense_replace",
        "num_attention_heads",
        "num_key_value_heads",
    ):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{key} must be an integer (got {value!r:.80})")
    if problems:
        raise RingzeroError(f"{cfg_file}: " + "; ".join(problems))
    return doc


def _model_config(path: str | Path) -> ModelConfig:
    config = read_config(path)
    try:
        return model_config_from_hf(config, str(path))
    except RingzeroError:
        raise
    except (TypeError, ValueError) as exc:  # a value of a type the reader does not expect
        raise RingzeroError(f"{Path(path) / 'config.json'}: a value has the wrong type: {exc}") from None


# safetensors dtype names -> bytes per element; integer and bool tensors are never model weights here.
_FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_OTHER_DTYPES = {
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own bound


def check_header(file: Path) -> None:
    """Read a safetensors header and refuse, naming the tensor, what would make the file unreadable or
    not a model's weights: a torn header, an unknown or non-float dtype, offsets that do not match the
    shape, data past the end of the file."""
    size = file.stat().st_size
    with file.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise RingzeroError(
                f"{file}: not a safetensors file: {size} bytes, shorter than the 8-byte header size"
            )
        n = int.from_bytes(head, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise RingzeroError(
                f"{file}: truncated or not safetensors: header of {n} bytes in a {size}-byte file"
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except RecursionError:
        raise RingzeroError(f"{file}: safetensors header nests too deeply") from None
    except ValueError as exc:
        raise RingzeroError(f"{file}: safetensors header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise RingzeroError(f"{file}: safetensors header is not a JSON object")
    data = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{file}: tensor {name}"
        if not isinstance(entry, dict):
            raise RingzeroError(f"{where}: header entry is not an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype in _OTHER_DTYPES:
            raise RingzeroError(
                f"{where}: dtype {dtype}; model weights must be one of {', '.join(_FLOAT_DTYPES)}"
            )
        if dtype not in _FLOAT_DTYPES:
            raise RingzeroError(f"{where}: unknown dtype {dtype!r:.40}")
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise RingzeroError(f"{where}: shape {shape!r:.80} is not a list of sizes")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise RingzeroError(f"{where}: data_offsets {offsets!r:.80} is not [begin, end]")
        begin, end = offsets
        want = _FLOAT_DTYPES[dtype]
        for d in shape:
            want *= d
        if not 0 <= begin <= end or end - begin != want:
            raise RingzeroError(
                f"{where}: {dtype} {shape} needs {want} bytes but data_offsets {offsets} span {end - begin}"
            )
        if end > data:
            raise RingzeroError(
                f"{where}: data ends at byte {end} of a {data}-byte data section (file truncated?)"
            )


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a folder, from its index when there is one."""
    folder = Path(path)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = parse_index(index.read_bytes(), str(index), RingzeroError)
        except RecursionError:
            raise RingzeroError(f"{index}: not valid JSON: nested too deeply") from None
        names = sorted(set(weight_map.values()))
        outside = [n for n in names if Path(n).name != n or n in ("", ".", "..")]
        if outside:
            raise RingzeroError(
                f"{index} names shard(s) outside the folder: {outside}; shards are plain file names"
            )
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
        check_header(file)
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
    """The folder's ``ModelConfig``, after checking every tensor's name and shape against it (headers
    only)."""
    from ringzero.model.hybrid import HybridLM

    cfg = _model_config(path)
    shapes = _open_all(path, lambda f, name: f.get_slice(name).get_shape())
    with torch.device("meta"):
        model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    placeholders = {n: torch.empty(s, device="meta") for n, s in shapes.items()}
    state_dict_from_hf(placeholders, expected_shapes(model), str(path), cfg.num_hidden_layers)
    return cfg


def load_folder(path: str | Path, policy: PrecisionPolicy | None = None, device="cpu") -> LoadedModel:
    """Rebuild a ``HybridLM`` from a local Ling 2.5 folder."""
    config = read_config(path)
    _model_config(path)  # refuse a foreign folder before reading its weights
    tensors = _open_all(path, lambda f, name: f.get_tensor(name))
    return build_loaded(config, tensors, str(Path(path).absolute()), policy, device)


def write_folder(
    path: str | Path,
    cfg: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    tokenizer=None,
    dtype: torch.dtype | None = torch.float32,
) -> list[str]:
    """Write ``state_dict`` as the Ling 2.5 folder ``path`` (which must not exist or be empty)."""
    from ringzero.store import CheckpointStore
    from ringzero.store.local import LocalBackend

    tensors, config, extra = checkpoint_parts(cfg, state_dict, tokenizer, dtype)
    with tempfile.TemporaryDirectory(prefix=".ringzero-export-", dir=Path(path).absolute().parent) as scratch:
        store = CheckpointStore(LocalBackend(scratch))
        store.save("export", tensors, config, extra_files=extra)
        return store.export_folder("export", path)
