"""The two small JSON files that make a checkpoint trustworthy: the manifest and the commit marker.

``manifest.json`` lists every other file of the checkpoint with its size and sha256 (and, for
shards, the tensors inside). ``COMMITTED`` is written last and holds the manifest's own size and
sha256, so a reader that starts from the marker can check every byte it will use, and a folder
without the marker is, by definition, not a checkpoint yet.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ringzero.errors import IntegrityError, StoreError

MANIFEST_FORMAT = "ringzero.checkpoint"
MANIFEST_VERSION = 1
COMMIT_FORMAT = "ringzero.commit"
COMMIT_VERSION = 1

MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
COMMIT_FILE = "COMMITTED"
STARTED_FILE = "STARTED"  # written first: marks the folder as a checkpoint being written


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dump_json(doc: Any, what: str) -> bytes:
    """Strict JSON (no NaN or Infinity, which other readers reject) as UTF-8, or a ``StoreError``."""
    try:
        return json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serializable: {exc}") from None


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str
    tensors: tuple[str, ...] = ()  # the tensor names inside, for safetensors shards

    def check(self, data: bytes, where: str) -> None:
        """Refuse ``data`` unless its size and sha256 are the recorded ones."""
        if len(data) != self.size:
            raise IntegrityError(f"{where}: size mismatch: expected {self.size} bytes, found {len(data)}")
        actual = sha256_hex(data)
        if actual != self.sha256:
            raise IntegrityError(f"{where}: sha256 mismatch: expected {self.sha256}, found {actual}")


@dataclass(frozen=True)
class Manifest:
    files: dict[str, FileEntry]
    meta: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0

    @property
    def shards(self) -> list[str]:
        return [name for name in self.files if name.endswith(".safetensors")]

    def to_bytes(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "created_at": self.created_at,
            "files": {
                name: {
                    "size": e.size,
                    "sha256": e.sha256,
                    **({"tensors": list(e.tensors)} if e.tensors else {}),
                }
                for name, e in self.files.items()
            },
            "meta": self.meta,
        }
        return dump_json(doc, "checkpoint meta")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        doc = _load(data, where)
        _check_format(doc, MANIFEST_FORMAT, MANIFEST_VERSION, where)
        try:
            files = {
                name: FileEntry(int(e["size"]), str(e["sha256"]), tuple(e.get("tensors", ())))
                for name, e in doc["files"].items()
            }
            return cls(
                files=files, meta=dict(doc.get("meta") or {}), created_at=float(doc.get("created_at", 0))
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Commit:
    manifest: FileEntry
    committed_at_ns: int

    def to_bytes(self) -> bytes:
        doc = {
            "format": COMMIT_FORMAT,
            "version": COMMIT_VERSION,
            "manifest_size": self.manifest.size,
            "manifest_sha256": self.manifest.sha256,
            "committed_at_ns": self.committed_at_ns,
        }
        return dump_json(doc, "commit marker")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Commit:
        doc = _load(data, where)
        _check_format(doc, COMMIT_FORMAT, COMMIT_VERSION, where)
        try:
            entry = FileEntry(int(doc["manifest_size"]), str(doc["manifest_sha256"]))
            return cls(manifest=entry, committed_at_ns=int(doc["committed_at_ns"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"{where}: malformed commit marker ({type(exc).__name__}: {exc})") from None


def _load(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise IntegrityError(f"{where}: expected a JSON object, found {type(doc).__name__}")
    return doc


def _check_format(doc: dict, fmt: str, version: int, where: str) -> None:
    if doc.get("format") != fmt:
        raise IntegrityError(f"{where}: not a {fmt} file (format={doc.get('format')!r})")
    if doc.get("version") != version:
        raise StoreError(
            f"{where}: {fmt} version {doc.get('version')!r} is not supported by this ringzero "
            f"(it reads version {version})"
        )
