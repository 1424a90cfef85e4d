"""s3:// against real S3 servers on loopback: moto, and the Ceph RADOS Gateway (marked rgw)."""

from __future__ import annotations

import pytest
import torch
import urllib3
from minio.error import S3Error
from store_kit import MiB, assert_bit_exact, big_state_dict, free_port

from ringzero.cli.main import main
from ringzero.errors import StoreError
from ringzero.store import open_store
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV, S3Credentials
from ringzero.store.s3 import S3Backend


def spy_on(backend, method: str, fail_on: dict[int, BaseException] | None = None) -> list[tuple]:
    """Record the calls of one minio client method; raise the given error instead of call number n."""
    real = getattr(backend._client, method)
    calls: list[tuple] = []

    def wrapper(*args, **kwargs):
        calls.append(args)
        error = (fail_on or {}).get(len(calls))
        if error is not None:
            raise error
        return real(*args, **kwargs)

    setattr(backend._client, method, wrapper)
    return calls


def test_multi_shard_checkpoint_goes_up_in_parts_and_loads_bit_exact(s3_store):
    tensors = big_state_dict()
    parts = spy_on(s3_store.backend, "_upload_part")

    uri = s3_store.save("run1/step-000100", tensors, {"hidden_size": 1024}, meta={"step": 100})

    # Two shards of about 11 MiB, each in three 5 MiB parts; the small files go up whole.
    assert sorted({(a[1].rsplit("/", 1)[1], a[5]) for a in parts}) == [
        (f"model-0000{s}-of-00002.safetensors", p) for s in (1, 2) for p in (1, 2, 3)
    ]
    assert all(len(a[2]) == 5 * MiB for a in parts if a[5] < 3)
    ckpt = s3_store.load(uri)
    assert_bit_exact(ckpt.tensors, tensors)
    assert (ckpt.config, ckpt.meta) == ({"hidden_size": 1024}, {"step": 100})
    assert s3_store.list() == [uri]
    assert s3_store.latest("run1/") == uri


def test_checkpoints_and_documents_stay_under_the_store_prefix(s3_env):
    bucket = s3_env.new_bucket()
    outside = s3_env.client()
    store = open_store(f"s3://{bucket}/team/a", s3_env.settings())
    store.save("c", {"w": torch.ones(3)}, {})
    store.put_json("runs/r/manifest.json", {"x": 1})
    sibling = open_store(f"s3://{bucket}/team/ab", s3_env.settings())  # a prefix of the name, not a folder

    keys = sorted(o.object_name for o in outside.list_objects(bucket, recursive=True))
    assert all(k.startswith("team/a/") for k in keys)
    assert sibling.list() == [] and sibling.get_json("runs/r/manifest.json") is None


def test_gc_aborts_incomplete_multipart_uploads(s3_store):
    backend = s3_store.backend
    backend._client._create_multipart_upload(
        backend.bucket, "ckpts/dead/model-00001-of-00002.safetensors", {}
    )

    result = s3_store.gc_uncommitted()

    assert result.partial_writes == 1
    assert backend._client._list_multipart_uploads(backend.bucket, prefix="ckpts/").uploads == []


def test_transient_failures_of_a_part_are_retried_and_the_save_completes(s3_store):
    tensors = big_state_dict(1)
    calls = spy_on(
        s3_store.backend,
        "_upload_part",
        fail_on={2: urllib3.exceptions.ProtocolError("connection reset"), 3: _s3_error("SlowDown", 503)},
    )
    uri = s3_store.save("flaky", tensors, {})
    assert len(calls) == 6 + 2  # six parts, two of them sent twice
    assert_bit_exact(s3_store.load(uri).tensors, tensors)


def test_refused_credentials_are_not_retried_and_say_where_to_look(s3_store):
    s3_store.save("c", {"w": torch.ones(1)}, {})
    calls = spy_on(s3_store.backend, "get_object", fail_on={1: _s3_error("AccessDenied", 403)})
    with pytest.raises(
        StoreError,
        match=rf"refused the request \(AccessDenied\); check the credentials in "
        rf"{ACCESS_KEY_ENV}/{SECRET_KEY_ENV}",
    ):
        s3_store.load("c")
    assert len(calls) == 1


def test_a_missing_bucket_is_a_clear_error(s3_env):
    with pytest.raises(
        StoreError,
        match=rf"bucket 'no-such-bucket-here' does not exist at {s3_env.endpoint}; "
        r"create it first",
    ):
        open_store("s3://no-such-bucket-here/x", s3_env.settings())


def test_an_unreachable_endpoint_fails_after_the_retries(s3_env):
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    sleeps: list[float] = []
    creds = S3Credentials(s3_env.access_key, s3_env.secret_key)
    with pytest.raises(
        StoreError,
        match=rf"open s3://b-x/p: S3 at {endpoint} still failing after 2 retries: "
        r"NewConnectionError: .*refused",
    ):
        S3Backend("b-x", "p", s3_env.settings(endpoint=endpoint), creds, sleep=sleeps.append)
    assert len(sleeps) == 2


@pytest.mark.rgw
@pytest.mark.xdist_group("store-rgw")
def test_the_gateway_refuses_wrong_credentials_with_a_clear_error(rgw_target, monkeypatch):
    bucket = rgw_target.new_bucket()
    monkeypatch.setenv(ACCESS_KEY_ENV, "WRONGACCESSKEY00042")
    monkeypatch.setenv(SECRET_KEY_ENV, "wrong-secret-never-printed-1234")
    with pytest.raises(StoreError) as caught:
        open_store(f"s3://{bucket}/x", rgw_target.settings())
    message = str(caught.value)
    assert f"S3 at {rgw_target.endpoint} refused the request (InvalidAccessKeyId)" in message
    assert "WRONGACCESSKEY00042" not in message and "wrong-secret-never-printed" not in message


def test_store_cli_lists_and_verifies_s3_checkpoints(s3_store, capsys):
    uri = s3_store.save("run/step-1", {"w": torch.arange(4)}, {})
    endpoint = s3_store.backend.settings.endpoint
    capsys.readouterr()
    assert main(["store", "ls", s3_store.uri, "--endpoint", endpoint]) == 0
    assert capsys.readouterr().out.splitlines() == [uri]
    assert main(["store", "verify", uri, "--endpoint", endpoint]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {uri}: 2 files, 1 tensors, ")


def _s3_error(code: str, status: int) -> S3Error:
    return S3Error(urllib3.HTTPResponse(status=status), code, "injected", "/", "req", "host")
