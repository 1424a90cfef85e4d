"""Damaged checkpoints are refused, each with a message naming the file and what is wrong with it."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ringzero.errors import IntegrityError, StoreError
from ringzero.store.layout import INDEX_FILE
from ringzero.store.manifest import COMMIT_FILE, CONFIG_FILE, MANIFEST_FILE, Commit, FileEntry, sha256_hex

SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture
def saved(any_store):
    """A committed three-shard checkpoint; returns (store, name)."""
    tensors = {"a": torch.arange(200, dtype=torch.float32), "b": torch.ones(200), "c": torch.zeros(100)}
    any_store.save("ck", tensors, {"hidden": 4}, meta={"step": 1})
    return any_store, "ck"


def manifest_of(store, name) -> dict:
    return json.loads(store.backend.read(f"{name}/{MANIFEST_FILE}"))


def rewrite_consistently(store, name, manifest: dict) -> None:
    """Replace the manifest and re-commit it, as a writer with a bug (not bit rot) would."""
    data = json.dumps(manifest).encode()
    store.backend.write(f"{name}/{MANIFEST_FILE}", data)
    store.backend.write(f"{name}/{COMMIT_FILE}", Commit(FileEntry(len(data), sha256_hex(data)), 1).to_bytes())


def refused(store, name, error=IntegrityError) -> str:
    """The message of loading and of verifying, which must agree."""
    with pytest.raises(error) as loading:
        store.load(name)
    with pytest.raises(error) as verifying:
        store.verify(name)
    assert str(loading.value) == str(verifying.value)
    return str(loading.value)


def test_a_flipped_byte_in_a_shard_is_refused_with_both_digests(saved):
    store, name = saved
    key = f"{name}/{SHARD}"
    data = bytearray(store.backend.read(key))
    expected = sha256_hex(bytes(data))
    data[-5] ^= 0x01
    store.backend.write(key, bytes(data))

    message = refused(store, name)
    assert message == (
        f"{store.backend.uri(key)}: sha256 mismatch: expected {expected}, found {sha256_hex(bytes(data))}"
    )


def test_a_truncated_shard_is_refused_by_size(saved):
    store, name = saved
    key = f"{name}/{SHARD}"
    data = store.backend.read(key)
    store.backend.write(key, data[:-100])
    assert refused(store, name) == (
        f"{store.backend.uri(key)}: size mismatch: expected {len(data)} bytes, found {len(data) - 100}"
    )


def test_a_deleted_shard_is_refused_as_missing(saved):
    store, name = saved
    key = f"{name}/{SHARD}"
    expected = manifest_of(store, name)["files"][SHARD]["sha256"]
    store.backend.delete([key])
    assert refused(store, name) == (
        f"{store.backend.uri(key)}: missing, though the manifest lists it (sha256 {expected})"
    )


def test_an_edited_manifest_no_longer_matches_the_commit_marker(saved):
    store, name = saved
    manifest = manifest_of(store, name)
    manifest["meta"]["step"] = 2  # a plausible, well-formed edit
    store.backend.write(f"{name}/{MANIFEST_FILE}", json.dumps(manifest, indent=2).encode())
    message = refused(store, name)
    assert message.startswith(f"{store.backend.uri(f'{name}/{MANIFEST_FILE}')}: ")
    assert re.search(r"(size|sha256) mismatch: expected \w+( bytes)?, found \w+", message)


def test_a_manifest_edited_to_the_same_size_is_caught_by_sha256(saved):
    store, name = saved
    key = f"{name}/{MANIFEST_FILE}"
    data = store.backend.read(key)
    edited = data.replace(b'"step": 1', b'"step": 9')
    assert len(edited) == len(data) and edited != data
    store.backend.write(key, edited)
    assert refused(store, name) == (
        f"{store.backend.uri(key)}: sha256 mismatch: expected {sha256_hex(data)}, found {sha256_hex(edited)}"
    )


def test_an_edited_config_is_refused(saved):
    store, name = saved
    key = f"{name}/{CONFIG_FILE}"
    data = store.backend.read(key)
    store.backend.write(key, data.replace(b"4", b"5"))
    assert refused(store, name).startswith(f"{store.backend.uri(key)}: sha256 mismatch: expected ")


def test_a_garbled_commit_marker_is_refused(saved):
    store, name = saved
    store.backend.write(f"{name}/{COMMIT_FILE}", b"{not json")
    assert re.fullmatch(r".*/ck/COMMITTED: not valid JSON \(.*\)", refused(store, name))


def test_a_marker_of_an_unknown_version_asks_for_a_newer_ringzero(saved):
    store, name = saved
    marker = json.loads(store.backend.read(f"{name}/{COMMIT_FILE}"))
    marker["version"] = 99
    store.backend.write(f"{name}/{COMMIT_FILE}", json.dumps(marker).encode())
    message = refused(store, name, StoreError)
    assert "ringzero.commit version 99 is not supported by this ringzero (it reads version 1)" in message


def test_a_manifest_naming_a_path_outside_the_checkpoint_is_refused(saved):
    store, name = saved
    manifest = manifest_of(store, name)
    manifest["files"]["../ck2/config.json"] = manifest["files"].pop(CONFIG_FILE)
    rewrite_consistently(store, name, manifest)
    assert refused(store, name).endswith("lists a file it may not: '../ck2/config.json'")


def test_a_shard_holding_other_tensors_than_listed_is_refused(saved):
    store, name = saved
    manifest = manifest_of(store, name)
    manifest["files"][SHARD]["tensors"] = ["b", "ghost"]  # the shard holds only "b"
    rewrite_consistently(store, name, manifest)
    with pytest.raises(
        IntegrityError,
        match=r"model-00002-of-00003.safetensors: tensors differ from the manifest "
        r"\(missing \['ghost'\], unexpected \[\]\)",
    ):
        store.load(name)


def test_a_shard_that_is_not_safetensors_is_refused_even_with_matching_digests(saved):
    store, name = saved
    garbage = b"\x80\x04pickle-looking bytes, never unpickled"
    store.backend.write(f"{name}/{SHARD}", garbage)
    manifest = manifest_of(store, name)
    manifest["files"][SHARD].update(size=len(garbage), sha256=sha256_hex(garbage))
    rewrite_consistently(store, name, manifest)
    with pytest.raises(
        IntegrityError, match=r"model-00002-of-00003.safetensors: not a readable safetensors file"
    ):
        store.load(name)


def test_an_intact_checkpoint_verifies(saved):
    store, name = saved
    manifest = store.verify(name)
    assert sorted(manifest.files) == [
        CONFIG_FILE,
        "model-00001-of-00003.safetensors",
        SHARD,
        "model-00003-of-00003.safetensors",
        INDEX_FILE,
    ]
    assert manifest.meta == {"step": 1}
