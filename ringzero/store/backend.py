"""What a storage backend provides: atomic whole-object writes, create-if-absent, plain reads, lists and
deletes.

Keys are relative to the store root, ``/``-separated, and checked by ``check_key`` before they
reach a backend. Everything checkpoint-shaped (manifests, markers, checksums) lives above this
layer, in ``checkpoint.py``, so both backends get exactly the same commit protocol.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from ringzero.errors import StoreError

# Segments start with a letter, digit or '_' so that no key can collide with the dot-prefixed
# temporary files of the local backend, and '.'/'..' can never walk out of the root.
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]*$")
MAX_KEY_LENGTH = 512

ProgressFn = Callable[[int], None]
"""Called with the number of bytes just transferred."""


class MissingObjectError(StoreError):
    """The object asked for does not exist."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified: float  # seconds since the epoch, as the storage reports it


class Backend(Protocol):
    def uri(self, key: str = "") -> str:
        """The full URI of ``key`` (of the root itself for ``""``)."""
        ...

    def write(self, key: str, data: bytes, on_bytes: ProgressFn | None = None) -> None:
        """Store ``data`` under ``key``; readers see either the old object or all of the new one."""
        ...

    def read(self, key: str) -> bytes:
        """The object's bytes; ``MissingObjectError`` if there is none."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` unless an object is already there; ``True`` if this call created
        it.

        Atomic against concurrent callers: of several racing to create one key, one gets ``True`` and
        the others ``False``, and nobody's object is overwritten. Readers see all of ``data`` or nothing.
        Meant for small objects (leases, markers); it never splits ``data`` into parts.
        """
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, recursively, in key order."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Remove the objects; keys that do not exist are ignored."""
        ...

    def discard_partial_writes(self, prefix: str, older_than: float) -> int:
        """Remove leftovers of interrupted writes under ``prefix`` started before ``older_than`` (epoch s)."""
        ...


def check_key(key: str, what: str = "key") -> str:
    """``key`` if it is a safe relative key, else a ``StoreError`` saying what is wrong with it."""
    if not isinstance(key, str) or not key:
        raise StoreError(f"{what} must be a non-empty string (got {key!r})")
    if len(key) > MAX_KEY_LENGTH:
        raise StoreError(f"{what} is longer than {MAX_KEY_LENGTH} characters: {key[:40]!r}...")
    bad = [s for s in key.split("/") if not _SEGMENT.match(s)]
    if bad:
        raise StoreError(
            f"{what} {key!r}: segment {bad[0]!r} is not allowed; use '/'-separated segments of letters, "
            "digits and '_.=+-', each starting with a letter, digit or '_'"
        )
    return key
