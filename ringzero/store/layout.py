"""The files of a committed checkpoint folder: a Hugging Face model folder plus the store's bookkeeping.

    model.safetensors                      the weights, when they fit one shard
    model-00001-of-00003.safetensors ...   several shards (1-based, as transformers names them), with
    model.safetensors.index.json           {"metadata": {"total_size": N}, "weight_map": {tensor: file}}
    config.json
    generation_config.json, tokenizer.json, ...   extra files handed to ``save``
    STARTED, manifest.json, COMMITTED      the store's own; never part of an exported folder

Nothing here knows about any model: names, the index and its agreement with the shards' contents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping

import torch

from ringzero.errors import IntegrityError, RingzeroError, StoreError
from ringzero.store.manifest import COMMIT_FILE, CONFIG_FILE, MANIFEST_FILE, STARTED_FILE, Manifest

SHARD_SUFFIX = ".safetensors"
SINGLE_SHARD_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
BOOKKEEPING_FILES = frozenset({STARTED_FILE, MANIFEST_FILE, COMMIT_FILE})
# The extra files ``import_folder`` takes from a local folder; ``save`` accepts any valid name.
KNOWN_EXTRA_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
_RESERVED = frozenset(n.lower() for n in (*BOOKKEEPING_FILES, CONFIG_FILE, INDEX_FILE))
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$")
_MAX_NAME = 255


def shard_file(index: int, count: int) -> str:
    """The name of shard ``index`` (0-based) of ``count``: ``model.safetensors`` when it is the only one."""
    return SINGLE_SHARD_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}{SHARD_SUFFIX}"


def is_shard(fname: str) -> bool:
    return fname.endswith(SHARD_SUFFIX)


def is_extra(fname: str) -> bool:
    """A file of the folder that is neither weights, the index, ``config.json`` nor bookkeeping."""
    return not is_shard(fname) and fname not in (INDEX_FILE, CONFIG_FILE) and fname not in BOOKKEEPING_FILES


def index_bytes(plan: list[list[str]], tensors: Mapping[str, torch.Tensor]) -> bytes:
    """``model.safetensors.index.json`` of the shards ``plan`` makes, written as transformers writes it."""
    weight_map = {t: shard_file(i, len(plan)) for i, names in enumerate(plan) for t in names}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def parse_index(data: bytes, where: str, error: type[RingzeroError] = IntegrityError) -> dict[str, str]:
    """The ``weight_map`` of an index file's bytes; ``error`` naming ``where`` if it is malformed."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{where}: not valid JSON ({exc})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise error(
            f'{where}: not a safetensors index: needs a "weight_map" object of tensor name -> file name'
        )
    return weight_map


def index_problems(weight_map: Mapping[str, str], shards: Mapping[str, Iterable[str]]) -> list[str]:
    """Every way the index disagrees with the shards (file name -> tensor names inside); empty if none."""
    indexed = set(weight_map.values())
    problems = [f"the index names {f}, which is missing" for f in sorted(indexed - set(shards))]
    problems += [f"{f} is not in the index" for f in shards if f not in indexed]
    holders: dict[str, list[str]] = {}
    for fname, names in shards.items():
        for t in names:
            holders.setdefault(t, []).append(fname)
    for t, files in holders.items():
        if len(files) > 1:
            problems.append(f"tensor {t!r} is in two shards: {', '.join(files)}")
        elif files[0] not in indexed:
            continue  # the whole shard is reported above
        elif t not in weight_map:
            problems.append(f"tensor {t!r} in {files[0]} is not in the index")
        elif weight_map[t] != files[0]:
            problems.append(f"tensor {t!r} is in {files[0]}, the index puts it in {weight_map[t]}")
    problems += [
        f"the index puts tensor {t!r} in {f}, which does not hold it"
        for t, f in weight_map.items()
        if t not in holders and f in shards
    ]
    return problems


def describe(problems: list[str], limit: int = 10) -> str:
    """The first ``limit`` problems, joined, and how many more there are."""
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def check_manifest_index(manifest: Manifest, index: bytes | None, where: str) -> None:
    """Refuse a checkpoint whose index (if it has one) disagrees with the tensors its manifest lists."""
    if index is None:
        return
    shards = {f: manifest.files[f].tensors for f in manifest.shards}
    problems = index_problems(parse_index(index, f"{where}/{INDEX_FILE}"), shards)
    if problems:
        raise IntegrityError(f"{where}/{INDEX_FILE}: disagrees with the manifest: " + describe(problems))


def check_hf_names(manifest: Manifest, where: str) -> None:
    """Refuse a checkpoint whose weights are not named as a Hugging Face folder needs (older store
    layouts)."""
    shards = manifest.shards
    expected = [shard_file(i, len(shards)) for i in range(len(shards))]
    if sorted(shards) != expected or (INDEX_FILE in manifest.files) != (len(shards) > 1):
        want = expected + ([INDEX_FILE] if len(shards) > 1 else [])
        raise StoreError(
            f"{where} is not a Hugging Face model folder: its weights are {sorted(shards)}"
            f"{' with' if INDEX_FILE in manifest.files else ' without'} {INDEX_FILE}, expected {want} "
            "(an older store layout: load it and save it again under a new name)"
        )


def check_extra_files(extra_files: Mapping[str, bytes] | None) -> dict[str, bytes]:
    """The extra files as ``{name: bytes}``, refusing (by name) any a checkpoint folder may not hold."""
    if extra_files is None:
        return {}
    if not isinstance(extra_files, Mapping):
        raise StoreError(
            f"extra_files must be a dict of file name -> bytes (got {type(extra_files).__name__})"
        )
    checked: dict[str, bytes] = {}
    for name, data in extra_files.items():
        if not isinstance(name, str) or not name:
            raise StoreError(f"extra file names must be non-empty strings (got {name!r})")
        if "/" in name or "\\" in name:
            raise StoreError(
                f"extra file {name!r}: must be a plain file name, without '/' (folders are not supported)"
            )
        if len(name) > _MAX_NAME or not _PLAIN_NAME.match(name):
            raise StoreError(
                f"extra file {name!r}: not a plain file name (use letters, digits and '_.=+-', "
                "starting with a letter, digit or '_')"
            )
        if name.lower() in _RESERVED or is_shard(name.lower()):
            raise StoreError(
                f"extra file {name!r}: the name is reserved for the checkpoint's "
                f"{'weights' if is_shard(name.lower()) or name.lower() == INDEX_FILE else 'own files'}"
            )
        if not isinstance(data, bytes | bytearray | memoryview):
            raise StoreError(f"extra file {name!r}: expected bytes, got {type(data).__name__}")
        checked[name] = bytes(data)
    return checked
