"""The ``s3://BUCKET/PREFIX`` backend, for any S3-compatible server, through the ``minio`` client.

Every request runs under one retry policy: connection failures, timeouts, HTTP 5xx and throttling
are retried with exponential backoff and jitter; a refused credential or a missing bucket is not,
and becomes a ``StoreError`` at once. urllib3's own retries are switched off so that this policy is
the only one (two nested retry loops would multiply the waits).
"""

from __future__ import annotations

import io
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import certifi
import structlog
import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError

from ringzero.errors import StoreError
from ringzero.store.backend import MissingObjectError, ObjectInfo, ProgressFn
from ringzero.store.config import S3Settings
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, S3Credentials
from ringzero.store.multipart import upload_in_parts
from ringzero.store.retry import Backoff, call_with_retries

log = structlog.get_logger(__name__)
T = TypeVar("T")

_THROTTLING = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
_TRANSIENT_CODES = _THROTTLING | {"RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted"}
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_MISSING_CODES = {"NoSuchKey", "NoSuchObject"}
_DELETE_BATCH = 1000  # the S3 limit of one DeleteObjects request


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same request may succeed: the server was unreachable, slow or overloaded."""
    if isinstance(exc, S3Error):
        return exc.code in _TRANSIENT_CODES or _retryable_status(exc.response.status)
    if isinstance(exc, ServerError):
        return _retryable_status(exc.status_code)
    if isinstance(exc, InvalidResponseError):  # e.g. an HTML 502 page from a proxy in front
        return _retryable_status(exc._code)
    if isinstance(exc, urllib3.exceptions.SSLError):  # a certificate problem does not heal by itself
        return False
    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def _retryable_status(status: int | None) -> bool:
    return status is not None and (status >= 500 or status == 429)


class S3Backend:
    """Objects live at ``BUCKET/PREFIX/key``. The bucket must exist; the store never creates one."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        settings: S3Settings,
        credentials: S3Credentials,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings
        self._credentials = credentials
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._backoff = Backoff(settings.max_retries, settings.backoff_base_s, settings.backoff_max_s)
        self._part_size = settings.part_size_mb * 1024 * 1024
        self._client = Minio(
            settings.endpoint,
            access_key=credentials.access_key,
            secret_key=credentials.secret_key,
            secure=settings.secure,
            region=settings.region,
            http_client=_http_client(settings),
        )
        exists = self._call(f"open {self.uri()}", lambda: self._client.bucket_exists(bucket))
        if not exists:
            raise StoreError(f"bucket {bucket!r} does not exist at {settings.endpoint}; create it first")

    def __repr__(self) -> str:
        return f"S3Backend({self.uri()} at {self.settings.endpoint})"

    def uri(self, key: str = "") -> str:
        path = "/".join(p for p in (self.prefix, key) if p)
        return f"s3://{self.bucket}/{path}" if path else f"s3://{self.bucket}"

    def write(self, key: str, data: bytes, on_bytes: ProgressFn | None = None) -> None:
        name = self._object(key)
        if len(data) > self._part_size:
            upload_in_parts(self._client, self.bucket, name, data, self._part_size, self._call, on_bytes)
            return
        self._call(
            f"write {self.uri(key)}",
            lambda: self._client.put_object(
                self.bucket,
                name,
                io.BytesIO(data),
                len(data),
                part_size=self._part_size,
                num_parallel_uploads=1,
            ),
        )
        if on_bytes:
            on_bytes(len(data))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """PutObject with ``If-None-Match: *``: the server refuses (412) if the key exists, and of
        concurrent creators exactly one succeeds (AWS S3, Ceph RGW and MinIO all honour it)."""
        if len(data) > self._part_size:
            raise StoreError(f"create {self.uri(key)}: {len(data)} bytes is too big for a conditional create")
        name, what = self._object(key), f"create {self.uri(key)}"
        attempts = 0

        def put() -> bool | None:
            nonlocal attempts
            attempts += 1
            headers = {"Content-Type": "application/octet-stream", "If-None-Match": "*"}
            try:
                self._client._put_object(self.bucket, name, data, headers=headers)
            except S3Error as exc:
                status = exc.response.status if exc.response is not None else None
                if exc.code == "PreconditionFailed" or status == 412:
                    return False
                if exc.code == "NotImplemented" or status == 501:
                    return None
                if exc.code == "ConditionalRequestConflict" or status == 409:
                    # Another conditional write of the key is in flight; AWS asks to retry.
                    raise _ConditionalConflict() from None
                raise
            return True

        try:
            created = self._call(
                what,
                lambda: call_with_retries(
                    put,
                    what=what,
                    backoff=self._backoff,
                    is_transient=lambda e: isinstance(e, _ConditionalConflict),
                    describe=lambda e: "ConditionalRequestConflict (HTTP 409)",
                    sleep=self._sleep,
                    rng=self._rng,
                ),
            )
        except _ConditionalConflict:
            raise StoreError(
                f"{what}: S3 at {self.settings.endpoint} still reports a conflicting concurrent write after "
                f"{self._backoff.max_retries} retries"
            ) from None
        if created is None:
            log.warning(
                "store.conditional_put_unsupported", endpoint=self.settings.endpoint, key=self.uri(key)
            )
            return self._put_then_verify(key, data)
        if not created and attempts > 1:
            # An earlier attempt may have created it and lost only the answer: the object is ours
            # if it holds our bytes (callers put something unique in it, such as a token).
            try:
                return self.read(key) == data
            except MissingObjectError:
                return False
        return created

    def _put_then_verify(self, key: str, data: bytes) -> bool:
        """For servers that answer ``If-None-Match`` with NotImplemented: check, write, read back.

        Weaker than a conditional put: two creators that both find the key absent both write it,
        and the first one's read-back may come before the second one's write, so both can get
        ``True`` (the second one's object wins). Callers that must be alone re-check later
        (a lease's heartbeat does). A server that silently ignores the header is not detected.
        """
        if self.exists(key):
            return False
        self.write(key, data)
        try:
            return self.read(key) == data
        except MissingObjectError:
            return False

    def read(self, key: str) -> bytes:
        def get() -> bytes:
            response = self._client.get_object(self.bucket, self._object(key))
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

        return self._call(f"read {self.uri(key)}", get)

    def exists(self, key: str) -> bool:
        try:
            self._call(
                f"stat {self.uri(key)}", lambda: self._client.stat_object(self.bucket, self._object(key))
            )
        except MissingObjectError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        found = self._call(
            f"list {self.uri(prefix)}",
            lambda: list(self._client.list_objects(self.bucket, prefix=root + prefix, recursive=True)),
        )
        infos = [
            ObjectInfo(
                o.object_name[len(root) :],
                o.size or 0,
                o.last_modified.timestamp() if o.last_modified else 0.0,
            )
            for o in found
            if not o.is_dir
        ]
        yield from sorted(infos, key=lambda i: i.key)

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._object(k) for k in keys]
        for start in range(0, len(names), _DELETE_BATCH):
            batch = [DeleteObject(n) for n in names[start : start + _DELETE_BATCH]]
            errors = self._call(
                f"delete {len(batch)} objects under {self.uri()}",
                lambda batch=batch: list(self._client.remove_objects(self.bucket, batch)),
            )
            if errors:
                first = errors[0]
                raise StoreError(f"could not delete {len(errors)} objects; first: {first.name}: {first.code}")

    def discard_partial_writes(self, prefix: str, older_than: float) -> int:
        root = f"{self.prefix}/" if self.prefix else ""
        aborted = 0
        key_marker = upload_marker = None
        while True:
            page = self._call(
                f"list incomplete uploads under {self.uri(prefix)}",
                lambda k=key_marker, u=upload_marker: self._client._list_multipart_uploads(
                    self.bucket,
                    prefix=root + prefix,
                    key_marker=k,
                    upload_id_marker=u,
                ),
            )
            for up in page.uploads:
                started = up.initiated_time.timestamp() if up.initiated_time else 0.0
                if started < older_than:
                    self._call(
                        f"abort incomplete upload of {up.object_name}",
                        lambda up=up: self._client._abort_multipart_upload(
                            self.bucket, up.object_name, up.upload_id
                        ),
                    )
                    aborted += 1
            if not page.is_truncated or not page.uploads:
                return aborted
            # The result's own next-marker fields are unreliable in minio 7.2; the last entry is the marker.
            key_marker, upload_marker = page.uploads[-1].object_name, page.uploads[-1].upload_id

    def _object(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one S3 request under the retry policy; every failure leaves as a ``StoreError``."""
        try:
            return call_with_retries(
                fn,
                what=what,
                backoff=self._backoff,
                is_transient=is_transient,
                describe=self._describe,
                sleep=self._sleep,
                rng=self._rng,
            )
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise MissingObjectError(f"{what}: no such object") from None
            raise StoreError(self._message(what, exc)) from None
        except (MinioException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(self._message(what, exc)) from None
        except ValueError as exc:  # minio's check of bucket and object names, before any request
            raise StoreError(f"{what}: {self._credentials.scrub(str(exc))}") from None

    def _message(self, what: str, exc: BaseException) -> str:
        where = f"S3 at {self.settings.endpoint}"
        code = getattr(exc, "code", None)
        if code in _AUTH_CODES:
            return (
                f"{what}: {where} refused the request ({code}); check the credentials in "
                f"{ACCESS_KEY_ENV}/{SECRET_KEY_ENV} (or their *_FILE variants) and their rights on bucket "
                f"{self.bucket!r}"
            )
        if code == "NoSuchBucket":
            return f"{what}: bucket {self.bucket!r} does not exist at {self.settings.endpoint}"
        if is_transient(exc):
            retries = self._backoff.max_retries
            return f"{what}: {where} still failing after {retries} retries: {self._describe(exc)}"
        return f"{what}: {where}: {self._describe(exc)}"

    def _describe(self, exc: BaseException) -> str:
        """A one-line account of ``exc`` with the credentials masked, for logs and messages."""
        if isinstance(exc, S3Error):
            text = f"{exc.code} (HTTP {exc.response.status})" + (f": {exc.message}" if exc.message else "")
        elif isinstance(exc, ServerError):
            text = f"HTTP {exc.status_code}"
        elif isinstance(exc, InvalidResponseError):
            text = f"unexpected non-S3 response, HTTP {exc._code}"
        else:
            reason: Any = getattr(exc, "reason", None) or exc
            text = f"{type(exc).__name__}: {reason}"
        return self._credentials.scrub(text)


class _ConditionalConflict(Exception):
    """HTTP 409 ConditionalRequestConflict: a concurrent conditional write; the request may be retried."""


def _http_client(settings: S3Settings) -> urllib3.PoolManager:
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=settings.timeout_s, read=settings.timeout_s),
        maxsize=4,
        cert_reqs="CERT_REQUIRED" if settings.cert_check else "CERT_NONE",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=False,
    )
