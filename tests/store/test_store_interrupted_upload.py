"""The server dies in the middle of a multipart upload of a multi-shard checkpoint.

Nothing committed may appear, a reader must refuse the half-written checkpoint, and saving again
once the server is back must produce a checkpoint that loads bit-exactly. Runs against moto (its
server thread stopped and its socket closed) and the Ceph RADOS Gateway (radosgw SIGKILLed; the
OSD keeps the data, as disks would).
"""

from __future__ import annotations

import pytest
from store_kit import MiB, S3Target, assert_bit_exact, big_state_dict

from ringzero.errors import StoreError
from ringzero.store import CheckpointStore, open_store
from ringzero.store.credentials import S3Credentials
from ringzero.store.s3 import S3Backend

SHARD = 12 * MiB
KILL_AT_PART = 4  # part 1 of shard 1: shard 0 is complete, shard 1's multipart upload has just begun


def kill_before_part(store: CheckpointStore, target: S3Target, number: int) -> list[int]:
    """Kill the server just before the client sends upload-part request ``number``."""
    client = store.backend._client
    real = client._upload_part
    sent: list[int] = []

    def upload_part(*args):
        sent.append(args[5])
        if len(sent) == number:
            target.kill()
        return real(*args)

    client._upload_part = upload_part
    return sent


def objects(target: S3Target, bucket: str) -> list[str]:
    return sorted(o.object_name for o in target.client().list_objects(bucket, recursive=True))


def incomplete_uploads(target: S3Target, bucket: str) -> list[str]:
    return [u.object_name for u in target.client()._list_multipart_uploads(bucket).uploads]


@pytest.mark.kills_server
def test_killed_server_leaves_no_committed_checkpoint_and_a_retry_loads_bit_exact(s3_env):
    target, bucket = s3_env, s3_env.new_bucket()
    root = f"s3://{bucket}/ckpts"
    tensors = big_state_dict(seed=5)
    writer = open_store(root, target.settings(), max_shard_bytes=SHARD)
    kill_before_part(writer, target, KILL_AT_PART)
    try:
        with pytest.raises(
            StoreError,
            match=r"upload part 1/3 of ckpts/run/step-1/model-00002-of-00002.safetensors: "
            r"S3 at .* still failing after 2 retries",
        ):
            writer.save("run/step-1", tensors, {"model": "tiny"})
    finally:
        target.restart()

    # What the dead server holds: the start marker and shard 0, shard 1 as an incomplete upload.
    assert objects(target, bucket) == [
        "ckpts/run/step-1/STARTED",
        "ckpts/run/step-1/model-00001-of-00002.safetensors",
    ]
    assert incomplete_uploads(target, bucket) == ["ckpts/run/step-1/model-00002-of-00002.safetensors"]

    reader = open_store(root, target.settings(), max_shard_bytes=SHARD)  # another process, after the restart
    assert reader.list() == []
    assert reader.latest() is None
    with pytest.raises(
        StoreError,
        match=r"no committed checkpoint at s3://.*/ckpts/run/step-1: a save of it "
        r"started but never committed",
    ):
        reader.load("run/step-1")

    uri = reader.save("run/step-1", tensors, {"model": "tiny"})  # the retry, from scratch

    ckpt = open_store(root, target.settings()).load(uri)
    assert_bit_exact(ckpt.tensors, tensors)
    assert ckpt.config == {"model": "tiny"}
    assert reader.list() == [uri]
    assert reader.gc_uncommitted().partial_writes == 1  # the upload the dead server left behind
    assert incomplete_uploads(target, bucket) == []


@pytest.mark.kills_server
def test_a_server_back_within_the_retries_lets_the_same_save_finish(s3_env):
    target, bucket = s3_env, s3_env.new_bucket()
    tensors = big_state_dict(seed=6)
    waits: list[float] = []

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:  # the server comes back during the first backoff
            target.restart()

    creds = S3Credentials(target.access_key, target.secret_key)
    store = CheckpointStore(
        S3Backend(bucket, "ckpts", target.settings(), creds, sleep=wait), max_shard_bytes=SHARD
    )
    sent = kill_before_part(store, target, KILL_AT_PART)

    uri = store.save("run/step-2", tensors, {})

    assert len(waits) == 1
    assert sent == [1, 2, 3, 1, 1, 2, 3]  # part 1 of shard 1 sent again, then the rest
    assert_bit_exact(store.load(uri).tensors, tensors)
    assert incomplete_uploads(target, bucket) == []
