"""Checkpoints on top of a backend: sharded safetensors, a manifest of checksums, a commit marker.

Layout of checkpoint ``NAME`` under the store root: a Hugging Face model folder (``layout.py``)
between the store's two markers and its manifest::

    NAME/STARTED                           written first: a save of NAME began
    NAME/model.safetensors                 or model-00001-of-0000N.safetensors ... and
    NAME/model.safetensors.index.json      (several shards only)
    NAME/config.json
    NAME/generation_config.json ...        extra files given to ``save``
    NAME/manifest.json                     size and sha256 of every file above (and the tensors in each shard)
    NAME/COMMITTED                         written last: size and sha256 of manifest.json

Readers start from ``COMMITTED``: without it the folder does not exist for ``list``, ``latest`` and
``load``, whatever else it holds. Checkpoints are immutable: saving over a committed name is
refused, while the leftovers of an interrupted save of the same name are deleted before a new
attempt, so old and new shards never mix. One writer per name at a time.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

import structlog
import torch

from ringzero.errors import IntegrityError, StoreError
from ringzero.store import folder as hf_folder
from ringzero.store import layout
from ringzero.store.backend import Backend, MissingObjectError, ObjectInfo, check_key
from ringzero.store.documents import decode_document, encode_document
from ringzero.store.manifest import (
    COMMIT_FILE,
    CONFIG_FILE,
    MANIFEST_FILE,
    STARTED_FILE,
    Commit,
    FileEntry,
    Manifest,
    dump_json,
    sha256_hex,
)
from ringzero.store.progress import transfer_progress
from ringzero.store.shards import check_tensors, deserialize, plan_shards, serialize
from ringzero.store.uri import parse_uri

log = structlog.get_logger(__name__)

DEFAULT_MAX_SHARD_BYTES = 1 << 30
_MARKERS = (COMMIT_FILE, STARTED_FILE)


@dataclass(frozen=True, repr=False)
class Checkpoint:
    tensors: dict[str, torch.Tensor]
    config: dict[str, Any]
    meta: dict[str, Any]
    uri: str
    files: dict[str, bytes] = field(default_factory=dict)  # the extra files (generation_config.json, ...)

    def __repr__(self) -> str:
        nbytes = sum(t.numel() * t.element_size() for t in self.tensors.values())
        return f"Checkpoint({self.uri}, {len(self.tensors)} tensors, {nbytes} bytes)"


@dataclass(frozen=True)
class GcResult:
    checkpoints: list[str] = field(default_factory=list)  # URIs of the uncommitted checkpoints removed
    objects: int = 0  # objects deleted with them
    partial_writes: int = 0  # interrupted uploads or temporary files discarded


class CheckpointStore:
    """Checkpoints and small documents under one root URI. Names and keys are relative to the root;
    everything handed out is a full URI, and every method that takes a name also takes that URI."""

    def __init__(self, backend: Backend, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        if max_shard_bytes < 1:
            raise StoreError(f"max_shard_bytes must be positive (got {max_shard_bytes})")
        self.backend = backend
        self.max_shard_bytes = max_shard_bytes

    def __repr__(self) -> str:
        return f"CheckpointStore({self.uri})"

    @property
    def uri(self) -> str:
        return self.backend.uri()

    def uri_of(self, name: str) -> str:
        return self.backend.uri(self.name_of(name))

    def name_of(self, uri_or_name: str) -> str:
        """The checkpoint name within this store of a name or a full URI under the root."""
        if isinstance(uri_or_name, str) and "://" in uri_or_name:
            root, target = str(parse_uri(self.uri)), str(parse_uri(uri_or_name))
            inside = root if root.endswith("/") else root + "/"  # file:/// is the one root ending in '/'
            if not target.startswith(inside):
                raise StoreError(f"{uri_or_name} is not under this store's root {root}")
            uri_or_name = target[len(inside) :]
        return check_key(uri_or_name, "checkpoint name")

    # -- checkpoints -------------------------------------------------------------------------

    def save(
        self,
        name: str,
        tensors: Mapping[str, torch.Tensor],
        config: Mapping[str, Any],
        meta: Mapping[str, Any] | None = None,
        *,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> str:
        """Write and commit checkpoint ``name``; returns its URI. Refuses a name already committed.

        ``extra_files`` (``{"generation_config.json": b"..."}``, tokenizer files) land next to
        ``config.json``, listed in the manifest like every other file.
        """
        name = check_key(name, "checkpoint name")
        check_tensors(tensors)
        extras = layout.check_extra_files(extra_files)
        if not isinstance(config, Mapping):
            raise StoreError(f"config must be a dict (got {type(config).__name__})")
        if meta is not None and not isinstance(meta, Mapping):
            raise StoreError(f"meta must be a dict (got {type(meta).__name__})")
        config_bytes = dump_json(dict(config), "config")
        meta = dict(meta or {})
        dump_json(meta, "meta")  # refuse bad meta before the first byte is written
        self._clear_for_save(name)

        uri, started = self.backend.uri(name), time.monotonic()
        self.backend.write(f"{name}/{STARTED_FILE}", dump_json({"started_at": time.time()}, "start marker"))
        files: dict[str, FileEntry] = {}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        plan = plan_shards(tensors, self.max_shard_bytes)
        with transfer_progress(f"save {name}", total) as advance:
            for index, names in enumerate(plan):
                fname, data = layout.shard_file(index, len(plan)), serialize(tensors, names)
                self.backend.write(f"{name}/{fname}", data, advance)
                files[fname] = FileEntry(len(data), sha256_hex(data), tuple(names))
                del data  # let this shard's bytes go before the next is built: peak memory stays one shard
        small = {layout.INDEX_FILE: layout.index_bytes(plan, tensors)} if len(plan) > 1 else {}
        for fname, data in {**small, CONFIG_FILE: config_bytes, **extras}.items():
            self.backend.write(f"{name}/{fname}", data)
            files[fname] = FileEntry(len(data), sha256_hex(data))
        manifest = Manifest(files=files, meta=meta, created_at=time.time()).to_bytes()
        self.backend.write(f"{name}/{MANIFEST_FILE}", manifest)
        commit = Commit(FileEntry(len(manifest), sha256_hex(manifest)), time.time_ns())
        self.backend.write(f"{name}/{COMMIT_FILE}", commit.to_bytes())
        log.info(
            "store.saved",
            uri=uri,
            tensors=len(tensors),
            shards=len(plan),
            extra_files=len(extras),
            bytes=sum(e.size for e in files.values()),
            seconds=round(time.monotonic() - started, 3),
        )
        return uri

    def load(self, uri_or_name: str) -> Checkpoint:
        """Read a committed checkpoint, verifying the size and sha256 of every file it uses."""
        name = self.name_of(uri_or_name)
        manifest = self._manifest(name)
        tensors: dict[str, torch.Tensor] = {}
        for part in self._shard_tensors(name, manifest, lambda _: True):
            tensors.update(part)
        self._check_index(name, manifest)
        config = json.loads(self._verified(name, CONFIG_FILE, manifest.files[CONFIG_FILE]))
        files = {f: self._verified(name, f, e) for f, e in manifest.files.items() if layout.is_extra(f)}
        return Checkpoint(
            tensors=tensors, config=config, meta=manifest.meta, uri=self.backend.uri(name), files=files
        )

    def tensor_names(self, uri_or_name: str) -> list[str]:
        """Every tensor name of a committed checkpoint, from its manifest (no shard is read)."""
        manifest = self._manifest(self.name_of(uri_or_name))
        return [t for fname in manifest.shards for t in manifest.files[fname].tensors]

    def iter_tensors(self, uri_or_name: str, keep) -> Iterator[dict[str, torch.Tensor]]:
        """The tensors ``keep(name)`` selects, one shard file at a time: a file holding none of them is not
        read, each file read is verified (size, sha256) and only its kept tensors are yielded. A pipeline
        stage reads the shards of its own layers this way, and no rank holds the whole checkpoint."""
        name = self.name_of(uri_or_name)
        manifest = self._manifest(name)
        self._check_index(name, manifest)
        yield from self._shard_tensors(name, manifest, keep)

    def _shard_tensors(self, name: str, manifest: Manifest, keep) -> Iterator[dict[str, torch.Tensor]]:
        seen: set[str] = set()
        for fname in manifest.shards:
            entry = manifest.files[fname]
            clash = seen & set(entry.tensors)
            if clash:
                raise IntegrityError(
                    f"{self.backend.uri(name)}: tensor {sorted(clash)[0]!r} is in two shards"
                )
            seen.update(entry.tensors)
            if not any(keep(t) for t in entry.tensors):
                continue
            part = deserialize(
                self._verified(name, fname, entry), entry.tensors, self.backend.uri(f"{name}/{fname}")
            )
            yield {t: part[t] for t in entry.tensors if keep(t)}  # the order they were saved in

    def read_file(self, uri_or_name: str, file_name: str) -> bytes:
        """One file of a committed checkpoint (``generation_config.json``, ...), checked against its
        manifest."""
        name = self.name_of(uri_or_name)
        manifest = self._manifest(name)
        if file_name not in manifest.files:
            raise StoreError(
                f"{self.backend.uri(name)} has no file {file_name!r}; it holds {sorted(manifest.files)}"
            )
        return self._verified(name, file_name, manifest.files[file_name])

    def verify(self, uri_or_name: str) -> Manifest:
        """Check every file of a committed checkpoint against its manifest without building tensors."""
        name = self.name_of(uri_or_name)
        manifest = self._manifest(name)
        index = None
        for fname, entry in manifest.files.items():
            data = self._verified(name, fname, entry)
            index = data if fname == layout.INDEX_FILE else index
        self._check_index(name, manifest, index)
        return manifest

    def export_folder(self, uri_or_name: str, local_dir: str | PathLike) -> list[str]:
        """Write a committed checkpoint as a plain local Hugging Face folder; see ``folder.export_folder``."""
        return hf_folder.export_folder(self, uri_or_name, local_dir)

    def import_folder(
        self, local_dir: str | PathLike, name: str, meta: Mapping[str, Any] | None = None
    ) -> str:
        """Commit a local Hugging Face folder as checkpoint ``name``; see ``folder.import_folder``."""
        return hf_folder.import_folder(self, local_dir, name, meta)

    def list(self, prefix: str = "") -> list[str]:
        """URIs of the committed checkpoints whose names start with ``prefix``, sorted by name."""
        return [self.backend.uri(n) for n in self._committed_names(prefix)]

    def latest(self, prefix: str = "") -> str | None:
        """URI of the most recently committed checkpoint whose name starts with ``prefix``, if any.

        "Most recent" is the commit time the writer recorded in the marker (ties go to the greater
        name), so it does not depend on how a backend reports modification times.
        """
        best: tuple[int, str] | None = None
        for name in self._committed_names(prefix):
            key = (self._commit(name).committed_at_ns, name)
            best = key if best is None or key > best else best
        return None if best is None else self.backend.uri(best[1])

    def gc_uncommitted(self, min_age_s: float = 0.0) -> GcResult:
        """Delete checkpoints whose save started but never committed, and leftovers of interrupted writes.

        Only folders untouched for ``min_age_s`` seconds are removed, so a gc may run next to a
        save in progress when given a margin longer than a save takes; with the default 0 it must not.
        """
        cutoff = time.time() - min_age_s
        folders: dict[str, list[ObjectInfo]] = defaultdict(list)
        for info in self.backend.list(""):
            folder, _, _ = info.key.rpartition("/")
            folders[folder].append(info)
        removed, objects = [], 0
        for folder, infos in sorted(folders.items()):
            names = {i.key.rpartition("/")[2] for i in infos}
            if not folder or COMMIT_FILE in names or STARTED_FILE not in names:
                continue
            if max(i.modified for i in infos) >= cutoff:
                continue
            self._delete_folder(folder, infos)
            removed.append(self.backend.uri(folder))
            objects += len(infos)
        partial = self.backend.discard_partial_writes("", cutoff)
        log.info("store.gc", root=self.uri, checkpoints=len(removed), objects=objects, partial_writes=partial)
        return GcResult(removed, objects, partial)

    # -- small objects -----------------------------------------------------------------------

    def put_json(self, key: str, doc: Any) -> str:
        """Store a JSON document atomically, with a checksum that ``get_json`` verifies; returns its URI."""
        key = self._object_key(key)
        self.backend.write(key, encode_document(doc, f"document {key!r}"))
        return self.backend.uri(key)

    def get_json(self, key: str) -> Any | None:
        """The document at ``key``, or ``None`` if there is none; ``IntegrityError`` if it was altered."""
        key = check_key(key, "document key")
        try:
            data = self.backend.read(key)
        except MissingObjectError:
            return None
        return decode_document(data, self.backend.uri(key))

    def put_bytes(self, key: str, data: bytes) -> str:
        """Store raw bytes atomically (logs, metrics); returns the URI."""
        key = self._object_key(key)
        self.backend.write(key, bytes(data))
        return self.backend.uri(key)

    def get_bytes(self, key: str) -> bytes | None:
        try:
            return self.backend.read(check_key(key, "object key"))
        except MissingObjectError:
            return None

    # -- internals ---------------------------------------------------------------------------

    def _committed_names(self, prefix: str) -> list[str]:
        if prefix.strip("/"):
            check_key(prefix.strip("/"), "prefix")
        suffix = "/" + COMMIT_FILE
        return sorted(i.key[: -len(suffix)] for i in self.backend.list(prefix) if i.key.endswith(suffix))

    def _commit(self, name: str) -> Commit:
        key = f"{name}/{COMMIT_FILE}"
        try:
            data = self.backend.read(key)
        except MissingObjectError:
            detail = ""
            if self.backend.exists(f"{name}/{STARTED_FILE}"):
                detail = ": a save of it started but never committed (interrupted, or still running)"
            raise StoreError(f"no committed checkpoint at {self.backend.uri(name)}{detail}") from None
        return Commit.from_bytes(data, self.backend.uri(key))

    def _manifest(self, name: str) -> Manifest:
        commit = self._commit(name)
        where = self.backend.uri(f"{name}/{MANIFEST_FILE}")
        manifest = Manifest.from_bytes(
            self._verified(name, MANIFEST_FILE, commit.manifest, "the commit marker"), where
        )
        for fname in manifest.files:
            if "/" in fname or fname in _MARKERS or fname == MANIFEST_FILE:
                raise IntegrityError(f"{where}: lists a file it may not: {fname!r}")
            check_key(fname, f"{where}: file name")
        if CONFIG_FILE not in manifest.files:
            raise IntegrityError(f"{where}: does not list {CONFIG_FILE}")
        return manifest

    def _check_index(self, name: str, manifest: Manifest, index: bytes | None = None) -> None:
        if index is None and layout.INDEX_FILE in manifest.files:
            index = self._verified(name, layout.INDEX_FILE, manifest.files[layout.INDEX_FILE])
        layout.check_manifest_index(manifest, index, self.backend.uri(name))

    def _verified(self, name: str, fname: str, entry: FileEntry, lister: str = "the manifest") -> bytes:
        key = f"{name}/{fname}"
        try:
            data = self.backend.read(key)
        except MissingObjectError:
            raise IntegrityError(
                f"{self.backend.uri(key)}: missing, though {lister} lists it (sha256 {entry.sha256})"
            ) from None
        entry.check(data, self.backend.uri(key))
        return data

    def _clear_for_save(self, name: str) -> None:
        """Refuse to save over or inside a committed checkpoint; remove an interrupted save's leftovers."""
        uri = self.backend.uri(name)
        if self.backend.exists(f"{name}/{COMMIT_FILE}"):
            raise StoreError(
                f"checkpoint {uri} is already committed; checkpoints are immutable: save under a new name"
            )
        parts = name.split("/")
        for depth in range(1, len(parts)):
            outer = "/".join(parts[:depth])
            if self.backend.exists(f"{outer}/{COMMIT_FILE}"):
                raise StoreError(
                    f"cannot save {name!r} inside committed checkpoint {self.backend.uri(outer)}"
                )
        leftovers = list(self.backend.list(name + "/"))
        if not leftovers:
            return
        nested = [i.key for i in leftovers if i.key.endswith("/" + COMMIT_FILE)]
        if nested:
            raise StoreError(
                f"cannot save {name!r}: it holds committed checkpoint "
                f"{self.backend.uri(nested[0].rpartition('/')[0])}"
            )
        if not any(i.key == f"{name}/{STARTED_FILE}" for i in leftovers):
            raise StoreError(
                f"cannot save {name!r}: {uri} holds objects that are not a checkpoint, e.g. "
                f"{leftovers[0].key}"
            )
        log.warning("store.replacing_uncommitted", uri=uri, objects=len(leftovers))
        self._delete_folder(name, leftovers)

    def _delete_folder(self, folder: str, infos: list[ObjectInfo]) -> None:
        # The start marker goes last, so a gc interrupted half-way still recognises what is left.
        started = f"{folder}/{STARTED_FILE}"
        self.backend.delete([i.key for i in infos if i.key != started])
        self.backend.delete([started])

    def _object_key(self, key: str) -> str:
        key = check_key(key, "object key")
        folder, _, base = key.rpartition("/")
        if base in _MARKERS:
            raise StoreError(f"object key {key!r}: {base} is reserved for checkpoint markers")
        if folder and self.backend.exists(f"{folder}/{COMMIT_FILE}"):
            raise StoreError(
                f"object key {key!r} lies inside committed checkpoint {self.backend.uri(folder)}"
            )
        return key
