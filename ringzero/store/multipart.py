"""Multipart upload of one object in which every part is retried on its own.

minio's ``put_object`` restarts nothing: one failed part fails the whole object. A checkpoint shard
can be gigabytes, so parts are sent here one by one through minio's low-level multipart calls
(``_create_multipart_upload`` and friends; pinned by the ``minio<8`` requirement), each wrapped in
the store's retry policy. The object appears only when the upload completes: S3 never shows a
half-uploaded object, so an interrupted upload leaves at most an incomplete upload, which the
store's garbage collection aborts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from minio import Minio
from minio.datatypes import Part

from ringzero.store.backend import ProgressFn

log = structlog.get_logger(__name__)
T = TypeVar("T")
Call = Callable[[str, Callable[[], Any]], Any]
"""``call(what, fn)`` runs ``fn`` under the retry policy and turns failures into ``StoreError``."""


def upload_in_parts(
    client: Minio,
    bucket: str,
    name: str,
    data: bytes,
    part_size: int,
    call: Call,
    on_bytes: ProgressFn | None = None,
) -> None:
    view = memoryview(data)
    offsets = range(0, len(view), part_size)
    upload_id = call(
        f"start multipart upload of {name}",
        lambda: client._create_multipart_upload(bucket, name, {"Content-Type": "application/octet-stream"}),
    )
    try:
        parts = []
        for number, offset in enumerate(offsets, start=1):
            chunk = bytes(view[offset : offset + part_size])

            def send(chunk: bytes = chunk, number: int = number) -> str:
                return client._upload_part(bucket, name, chunk, None, upload_id, number)

            etag = call(f"upload part {number}/{len(offsets)} of {name}", send)
            parts.append(Part(number, etag))
            if on_bytes:
                on_bytes(len(chunk))
        call(
            f"complete multipart upload of {name}",
            lambda: client._complete_multipart_upload(bucket, name, upload_id, parts),
        )
    except BaseException:
        _abort_quietly(client, bucket, name, upload_id)
        raise


def _abort_quietly(client: Minio, bucket: str, name: str, upload_id: str) -> None:
    # One attempt only: the server may be the reason we are here. Whatever survives is found and
    # aborted later by gc_uncommitted.
    try:
        client._abort_multipart_upload(bucket, name, upload_id)
    except Exception as exc:
        log.info("store.abort_failed", object=name, error=type(exc).__name__)
