"""Committed checkpoints to and from plain local Hugging Face model folders.

    store.export_folder("run/step-000100", "/models/policy")   # what SGLang / transformers load
    store.import_folder("/downloads/Ling-2.5", "base")          # a published folder into the store

Exporting writes every file the manifest lists (weights, index, ``config.json``, extra files) and none
of the store's bookkeeping; each file is checked against its sha256 first, and the folder appears
whole or not at all. Importing takes the weights, ``config.json`` and the known extra files and commits
them with ``save``. Neither knows anything about a model: checking the weights against the model's
config is the caller's business.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import structlog

from ringzero.errors import StoreError
from ringzero.store.layout import (
    INDEX_FILE,
    KNOWN_EXTRA_FILES,
    SINGLE_SHARD_FILE,
    check_hf_names,
    describe,
    index_problems,
    is_shard,
    parse_index,
)
from ringzero.store.local import fsync_dir
from ringzero.store.manifest import CONFIG_FILE
from ringzero.store.progress import transfer_progress

log = structlog.get_logger(__name__)


def export_folder(store, uri_or_name: str, local_dir: str | os.PathLike) -> list[str]:
    """Write committed checkpoint ``uri_or_name`` of ``store`` as the folder ``local_dir``; returns its file
    names.

    The files go to a hidden folder next to ``local_dir``, each fsynced, and that folder is renamed to
    ``local_dir`` at the end. An existing ``local_dir`` must be an empty folder.
    """
    name = store.name_of(uri_or_name)
    target = Path(local_dir).expanduser().absolute()
    _check_target(target)
    manifest = store._manifest(name)
    where = store.backend.uri(name)
    check_hf_names(manifest, where)
    index = (
        store._verified(name, INDEX_FILE, manifest.files[INDEX_FILE])
        if INDEX_FILE in manifest.files
        else None
    )
    store._check_index(name, manifest, index)

    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        with transfer_progress(f"export {name}", sum(e.size for e in manifest.files.values())) as advance:
            for fname, entry in manifest.files.items():
                data = index if fname == INDEX_FILE else store._verified(name, fname, entry)
                _write_synced(tmp / fname, data)
                advance(len(data))
                del data  # one file in memory at a time
        fsync_dir(tmp)
        _check_target(target)
        os.rename(tmp, target)  # replaces an empty folder atomically; refused if it filled up meanwhile
        fsync_dir(target.parent)
    except OSError as exc:
        raise StoreError(f"cannot export {where} to {target}: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("store.exported", uri=where, folder=str(target), files=len(manifest.files))
    return sorted(manifest.files)


def import_folder(
    store, local_dir: str | os.PathLike, name: str, meta: Mapping[str, Any] | None = None
) -> str:
    """Commit the Hugging Face folder ``local_dir`` as checkpoint ``name`` of ``store``; returns its URI.

    Takes ``model.safetensors``, or the shards ``model.safetensors.index.json`` maps, with
    ``config.json`` and those of ``KNOWN_EXTRA_FILES`` present; other files are left out (logged).
    Refused, naming each problem: a missing ``config.json``, no weights, an index that names a missing
    file or disagrees with the shards' contents, a tensor in two shards, a shard the index leaves out.
    """
    folder = Path(local_dir).expanduser().absolute()
    if not folder.is_dir():
        raise StoreError(f"cannot import {folder}: not a folder")
    present = sorted(p.name for p in folder.iterdir() if p.is_file())
    shards = [f for f in present if is_shard(f)]
    if CONFIG_FILE not in present:
        raise StoreError(f"cannot import {folder}: it has no {CONFIG_FILE}")
    if not shards:
        raise StoreError(f"cannot import {folder}: it has no *.safetensors weights")
    contents = {f: _tensor_names(folder / f) for f in shards}
    if INDEX_FILE in present:
        weight_map = parse_index(_read(folder / INDEX_FILE), str(folder / INDEX_FILE), StoreError)
        problems = index_problems(weight_map, contents)
        if problems:
            raise StoreError(
                f"cannot import {folder}: {INDEX_FILE} does not fit the shards: " + describe(problems)
            )
    elif shards != [SINGLE_SHARD_FILE]:
        raise StoreError(
            f"cannot import {folder}: without {INDEX_FILE} the weights must be one {SINGLE_SHARD_FILE}, "
            f"found {shards}"
        )

    config = _json_object(folder / CONFIG_FILE)
    extras = {f: _read(folder / f) for f in KNOWN_EXTRA_FILES if f in present}
    ignored = [
        f for f in present if f not in contents and f not in extras and f not in (CONFIG_FILE, INDEX_FILE)
    ]
    if ignored:
        log.info("store.import_ignored", folder=str(folder), files=ignored)
    tensors: dict = {}
    for fname in shards:
        try:
            tensors.update(safetensors.torch.load_file(folder / fname))
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise StoreError(
                f"cannot import {folder / fname}: not a readable safetensors file ({exc})"
            ) from None
    return store.save(name, tensors, config, meta, extra_files=extras)


def _check_target(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise StoreError(f"cannot export to {target}: it exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        raise StoreError(f"cannot export to {target}: the folder exists and is not empty")


def _tensor_names(path: Path) -> list[str]:
    try:
        with safetensors.safe_open(path, framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises its own SafetensorError
        raise StoreError(f"cannot import {path}: not a readable safetensors file ({exc})") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise StoreError(f"cannot import {path}: {exc.strerror or exc}") from None


def _json_object(path: Path) -> dict:
    try:
        doc = json.loads(_read(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"cannot import {path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise StoreError(f"cannot import {path}: expected a JSON object, found {type(doc).__name__}")
    return doc


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
