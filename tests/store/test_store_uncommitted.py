"""A save that dies part-way leaves nothing readers accept; gc removes it; a new save replaces it."""

from __future__ import annotations

import os
import time

import pytest
import torch
from store_kit import CrashingBackend, SimulatedCrash, assert_bit_exact

from ringzero.errors import StoreError
from ringzero.store import CheckpointStore
from ringzero.store.manifest import COMMIT_FILE, STARTED_FILE

# Writes of one save, in order: STARTED, shards 1..n, the index, config.json, manifest.json, COMMITTED.
FOUR_SHARDS = {f"w{i}": torch.full((200,), float(i)) for i in range(4)}  # 800 bytes each, 1024-byte shards
WRITES = 1 + len(FOUR_SHARDS) + 4


def crashed_save(store: CheckpointStore, name: str, at: int, tensors=FOUR_SHARDS) -> None:
    crashing = CheckpointStore(CrashingBackend(store.backend, at), max_shard_bytes=store.max_shard_bytes)
    with pytest.raises(SimulatedCrash):
        crashing.save(name, tensors, {"attempt": 1})


@pytest.mark.parametrize("at", range(2, WRITES + 1), ids=lambda n: f"dies-at-write-{n}")
def test_a_save_dying_at_any_write_leaves_nothing_readable(any_store, at):
    crashed_save(any_store, "run/step-1", at)

    assert any_store.list() == []
    assert any_store.latest() is None
    with pytest.raises(
        StoreError,
        match=r"no committed checkpoint at .*run/step-1: a save of it started but "
        r"never committed \(interrupted, or still running\)",
    ):
        any_store.load("run/step-1")


def test_uncommitted_folders_hide_among_committed_ones(any_store):
    any_store.save("run/step-1", {"w": torch.ones(2)}, {})
    crashed_save(any_store, "run/step-2", at=WRITES)  # everything but the commit marker was written
    assert any_store.list("run/") == [f"{any_store.uri}/run/step-1"]
    assert any_store.latest("run/") == f"{any_store.uri}/run/step-1"


def test_gc_removes_uncommitted_checkpoints_only(any_store):
    keep = any_store.save("run/step-1", {"w": torch.ones(2)}, {})
    any_store.put_json("runs/r1/manifest.json", {"status": "running"})
    any_store.put_bytes("stages/abc/metrics.jsonl", b'{"loss": 1}\n')
    crashed_save(any_store, "run/step-2", at=4)
    crashed_save(any_store, "run/step-3", at=WRITES)
    before = {i.key for i in any_store.backend.list("")}

    result = any_store.gc_uncommitted()

    assert result.checkpoints == [f"{any_store.uri}/run/step-2", f"{any_store.uri}/run/step-3"]
    after = {i.key for i in any_store.backend.list("")}
    gone = before - after
    assert result.objects == len(gone)
    assert {k.rsplit("/", 1)[0] for k in gone} == {"run/step-2", "run/step-3"}
    assert any_store.list() == [keep]
    assert any_store.get_json("runs/r1/manifest.json") == {"status": "running"}
    assert any_store.get_bytes("stages/abc/metrics.jsonl") == b'{"loss": 1}\n'
    assert any_store.gc_uncommitted().checkpoints == []


def test_gc_spares_folders_written_to_within_min_age(file_store):
    crashed_save(file_store, "old", at=4)
    crashed_save(file_store, "recent", at=4)
    an_hour_ago = time.time() - 3600
    for path in (file_store.backend.root / "old").iterdir():
        os.utime(path, (an_hour_ago, an_hour_ago))

    result = file_store.gc_uncommitted(min_age_s=600)

    assert result.checkpoints == [file_store.uri_of("old")]
    assert not (file_store.backend.root / "old").exists()
    assert (file_store.backend.root / "recent" / STARTED_FILE).exists()


def test_gc_removes_temporary_files_of_interrupted_local_writes(file_store):
    file_store.save("c", {"w": torch.ones(2)}, {})
    folder = file_store.backend.root / "c"
    stray = folder / ".model.safetensors.tmp-0123abcd"  # what a kill during a write leaves
    stray.write_bytes(b"half a shard")
    assert file_store.list() == [file_store.uri_of("c")]
    assert all(".tmp-" not in i.key for i in file_store.backend.list(""))

    result = file_store.gc_uncommitted()

    assert (result.checkpoints, result.partial_writes) == ([], 1)
    assert not stray.exists()
    file_store.verify("c")


def test_a_new_save_after_a_crash_replaces_every_leftover(any_store):
    crashed_save(any_store, "ck", at=WRITES)  # four shards and the index written, never committed
    fewer = {"only": torch.arange(3)}

    uri = any_store.save("ck", fewer, {"attempt": 2})

    keys = sorted(i.key for i in any_store.backend.list("ck/"))
    assert [k for k in keys if k.endswith(".safetensors")] == ["ck/model.safetensors"]
    ckpt = any_store.load(uri)
    assert_bit_exact(ckpt.tensors, fewer)
    assert ckpt.config == {"attempt": 2}


def test_gc_interrupted_half_way_leaves_the_folder_recognisable(file_store):
    crashed_save(file_store, "ck", at=WRITES)
    backend = file_store.backend
    real_delete = backend.delete
    calls = []

    def dying_delete(keys):
        calls.append(list(keys))
        if len(calls) == 2:  # the start marker goes in a second, final call
            raise SimulatedCrash("gc")
        real_delete(calls[-1])

    backend.delete = dying_delete
    with pytest.raises(SimulatedCrash):
        file_store.gc_uncommitted()
    assert calls[1] == [f"ck/{STARTED_FILE}"]
    assert (backend.root / "ck" / STARTED_FILE).exists()

    del backend.delete
    assert file_store.gc_uncommitted().checkpoints == [file_store.uri_of("ck")]
    assert not (backend.root / "ck").exists()


def test_start_marker_is_the_first_write_and_commit_marker_the_last(any_store):
    recording = CrashingBackend(any_store.backend)
    CheckpointStore(recording, max_shard_bytes=1024).save("ck", FOUR_SHARDS, {})
    assert len(recording.written) == WRITES
    assert recording.written[0] == f"ck/{STARTED_FILE}"
    assert recording.written[-1] == f"ck/{COMMIT_FILE}"
