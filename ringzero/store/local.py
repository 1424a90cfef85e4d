"""The ``file://`` backend: a folder on a local or shared filesystem."""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from ringzero.errors import StoreError
from ringzero.store.backend import MissingObjectError, ObjectInfo, ProgressFn

_TMP_MARK = ".tmp-"
_FOLDER_RACE_RETRIES = 5
# link() refused by the filesystem itself (FAT, some FUSE and SMB mounts), not by the name being taken.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}


def _durable_temp(path: Path, data: bytes) -> Path:
    """``data`` in a hidden, fsynced temporary file beside ``path`` (the caller renames or links it)."""
    tmp = path.with_name(f".{path.name}{_TMP_MARK}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


class LocalBackend:
    """Objects are files under ``root``; a write goes to a hidden temporary file, is fsynced, and
    renamed over the target, so a crash leaves either the old file or the new one, never a torn one."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().absolute()
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store root {self.root} exists and is not a folder")

    def __repr__(self) -> str:
        return f"LocalBackend({self.uri()})"

    def uri(self, key: str = "") -> str:
        return "file://" + str(self.root / key if key else self.root)

    def write(self, key: str, data: bytes, on_bytes: ProgressFn | None = None) -> None:
        path = self.root / key
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = _durable_temp(path, data)
            try:
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            # The rename is durable only once the folder entry itself reaches the disk.
            fsync_dir(path.parent)
        except OSError as exc:
            raise StoreError(f"cannot write {self.uri(key)}: {exc.strerror or exc}") from None
        if on_bytes:
            on_bytes(len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """The object is written whole to a hidden temporary file, then hard-linked to its name:
        ``link`` fails if the name exists, atomically, on local filesystems and on NFS alike, and
        the name never points at a half-written file."""
        path = self.root / key
        for _attempt in range(_FOLDER_RACE_RETRIES):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = _durable_temp(path, data)
                try:
                    try:
                        os.link(tmp, path)
                    except FileExistsError:
                        return False
                    except OSError as exc:
                        if exc.errno not in _NO_HARD_LINKS:
                            raise
                        if not _create_exclusive(path, data):
                            return False
                finally:
                    tmp.unlink(missing_ok=True)
                fsync_dir(path.parent)
                return True
            except FileNotFoundError:
                # A delete emptied and removed the folder between our mkdir and our write: go again.
                continue
            except OSError as exc:
                raise StoreError(f"cannot create {self.uri(key)}: {exc.strerror or exc}") from None
        raise StoreError(f"cannot create {self.uri(key)}: its folder keeps disappearing (concurrent deletes)")

    def read(self, key: str) -> bytes:
        path = self.root / key
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise MissingObjectError(f"{self.uri(key)} does not exist") from None
        except OSError as exc:
            raise StoreError(f"cannot read {self.uri(key)}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        return (self.root / key).is_file()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for key, path in self._walk(prefix):
            if _TMP_MARK in path.name and path.name.startswith("."):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # deleted since the walk saw it
                continue
            yield ObjectInfo(key, st.st_size, st.st_mtime)

    def delete(self, keys: Iterable[str]) -> None:
        folders = set()
        for key in keys:
            path = self.root / key
            path.unlink(missing_ok=True)
            folders.add(path.parent)
        # Empty folders are what a deleted checkpoint would otherwise leave behind.
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            while folder != self.root and folder.is_relative_to(self.root):
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent

    def discard_partial_writes(self, prefix: str, older_than: float) -> int:
        removed = 0
        for _, path in self._walk(prefix):
            if not (path.name.startswith(".") and _TMP_MARK in path.name):
                continue
            try:
                if path.stat().st_mtime < older_than:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:  # its writer finished or gave up meanwhile
                continue
        return removed

    def _walk(self, prefix: str) -> Iterator[tuple[str, Path]]:
        # Start at the deepest folder the prefix names, so listing one checkpoint stays cheap.
        start = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not start.is_dir():
            return
        found = []
        for folder, _dirs, files in os.walk(start):
            for name in files:
                path = Path(folder, name)
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append((key, path))
        yield from sorted(found)


def _create_exclusive(path: Path, data: bytes) -> bool:
    """``O_CREAT | O_EXCL`` for filesystems without hard links. Atomic too, but a reader may see the
    file before all of ``data`` is in it, so readers of such objects must treat a torn one as busy."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
