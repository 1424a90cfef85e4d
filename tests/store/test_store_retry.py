"""The retry policy: which errors are retried, how long it waits, when it gives up."""

from __future__ import annotations

import random

import pytest
import urllib3
from minio.error import InvalidResponseError, S3Error, ServerError

from ringzero.store.retry import Backoff, call_with_retries
from ringzero.store.s3 import is_transient


def s3_error(code: str, status: int) -> S3Error:
    return S3Error(urllib3.HTTPResponse(status=status), code, "msg", "/b/k", "req", "host")


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (s3_error("SlowDown", 503), True),
        (s3_error("InternalError", 500), True),
        (s3_error("ServiceUnavailable", 503), True),
        (s3_error("RequestTimeout", 400), True),  # S3 sends this one as a 400
        (s3_error("TooManyRequests", 429), True),
        (s3_error("AccessDenied", 403), False),
        (s3_error("InvalidAccessKeyId", 403), False),
        (s3_error("SignatureDoesNotMatch", 403), False),
        (s3_error("NoSuchBucket", 404), False),
        (s3_error("NoSuchKey", 404), False),
        (ServerError("server failed", 502), True),
        (ServerError("server failed", 404), False),
        (InvalidResponseError(504, "text/html", "<html>gateway timeout</html>"), True),
        (InvalidResponseError(400, "text/html", "bad"), False),
        (urllib3.exceptions.NewConnectionError(None, "connection refused"), True),
        (urllib3.exceptions.ProtocolError("connection aborted"), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/", "read timed out"), True),
        (urllib3.exceptions.SSLError("certificate verify failed"), False),
        (ConnectionResetError(104, "reset by peer"), True),
        (TimeoutError(), True),
        (ValueError("invalid bucket name"), False),
    ],
    ids=lambda v: v if isinstance(v, bool) else type(v).__name__ + ":" + str(getattr(v, "code", "")),
)
def test_transient_errors_are_connection_faults_5xx_and_throttling(error, transient):
    assert is_transient(error) is transient


def test_backoff_doubles_with_jitter_and_is_capped():
    backoff = Backoff(max_retries=10, base_s=0.5, max_s=4.0)
    rng = random.Random(0)
    for retry, ceiling in enumerate([0.5, 1.0, 2.0, 4.0, 4.0, 4.0]):
        waits = [backoff.delay(retry, rng) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(set(waits)) > 100  # jittered, not a fixed schedule


class Flaky:
    def __init__(self, errors: list[BaseException]):
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def run(fn, max_retries=3):
    sleeps: list[float] = []
    result = call_with_retries(
        fn,
        what="test op",
        backoff=Backoff(max_retries, 1.0, 8.0),
        is_transient=is_transient,
        describe=lambda e: type(e).__name__,
        sleep=sleeps.append,
        rng=random.Random(1),
    )
    return result, sleeps


def test_transient_errors_are_retried_until_success():
    fn = Flaky([ConnectionResetError(), s3_error("SlowDown", 503)])
    result, sleeps = run(fn)
    assert (result, fn.calls, len(sleeps)) == ("done", 3, 2)
    assert 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0


def test_the_last_transient_error_propagates_once_retries_run_out():
    last = s3_error("InternalError", 500)
    fn = Flaky([ConnectionResetError()] * 3 + [last])
    with pytest.raises(S3Error) as caught:
        run(fn, max_retries=3)
    assert caught.value is last
    assert fn.calls == 4


@pytest.mark.parametrize(
    "error", [s3_error("AccessDenied", 403), s3_error("NoSuchBucket", 404), ValueError("x")]
)
def test_permanent_errors_are_not_retried(error):
    fn = Flaky([error])
    with pytest.raises(type(error)):
        run(fn)
    assert fn.calls == 1


def test_zero_retries_means_one_attempt():
    fn = Flaky([ConnectionResetError()])
    with pytest.raises(ConnectionResetError):
        run(fn, max_retries=0)
    assert fn.calls == 1
