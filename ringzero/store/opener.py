"""Open the store a URI names: ``file://`` needs nothing else, ``s3://`` needs settings and credentials."""

from __future__ import annotations

from ringzero.store.checkpoint import DEFAULT_MAX_SHARD_BYTES, Checkpoint, CheckpointStore
from ringzero.store.config import S3Settings
from ringzero.store.credentials import credentials_from_env
from ringzero.store.local import LocalBackend
from ringzero.store.s3 import S3Backend
from ringzero.store.uri import parse_uri


def open_store(
    root: str, s3: S3Settings | None = None, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES
) -> CheckpointStore:
    """The store at ``root`` (``file://PATH`` or ``s3://BUCKET/PREFIX``).

    For ``s3://`` the endpoint, TLS and retry settings come from ``s3`` (defaults if ``None``) and
    the credentials from the environment (see ``ringzero.store.credentials``); the bucket is
    checked at once, so a wrong endpoint, bad credentials or a missing bucket fail here, clearly.
    """
    where = parse_uri(root)
    if where.scheme == "file":
        backend = LocalBackend(where.path)
    else:
        backend = S3Backend(where.bucket, where.path, s3 or S3Settings(), credentials_from_env())
    return CheckpointStore(backend, max_shard_bytes=max_shard_bytes)


def load_checkpoint(uri: str, s3: S3Settings | None = None) -> Checkpoint:
    """Load the committed checkpoint at a full URI, opening its parent folder as the store."""
    root, name = parse_uri(uri).parent()
    return open_store(str(root), s3).load(name)
