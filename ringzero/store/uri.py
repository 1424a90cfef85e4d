"""Store URIs: ``file://PATH`` (relative paths resolve against the working folder) and ``s3://BUCKET/PREFIX``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ringzero.errors import StoreError


@dataclass(frozen=True)
class StoreURI:
    scheme: str  # "file" or "s3"
    bucket: str  # "" for file://
    path: str  # absolute folder for file://, key prefix (no leading or trailing '/') for s3://

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        return f"s3://{self.bucket}/{self.path}" if self.path else f"s3://{self.bucket}"

    def parent(self) -> tuple[StoreURI, str]:
        """The folder holding this location, and the last segment of the name within it."""
        head, _, last = self.path.rstrip("/").rpartition("/")
        if not last:
            raise StoreError(f"{self} names no checkpoint folder")
        return StoreURI(self.scheme, self.bucket, head or ("/" if self.scheme == "file" else "")), last


def parse_uri(uri: str) -> StoreURI:
    if not isinstance(uri, str):
        raise StoreError(f"expected a store URI string, got {type(uri).__name__}")
    if uri.startswith("file://"):
        raw = uri[len("file://") :]
        if not raw:
            raise StoreError(f"{uri!r} names no folder")
        path = os.path.abspath(os.path.expanduser(raw))
        return StoreURI("file", "", path)
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[len("s3://") :].partition("/")
        if not bucket:
            raise StoreError(f"{uri!r} has no bucket name")
        return StoreURI("s3", bucket, prefix.strip("/"))
    raise StoreError(f"{uri!r} is not a store URI: use file://PATH or s3://BUCKET/PREFIX")
