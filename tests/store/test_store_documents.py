"""Small objects next to checkpoints: checksummed JSON documents and raw bytes."""

from __future__ import annotations

import json

import pytest
import torch

from ringzero.errors import IntegrityError, StoreError


def test_json_document_round_trip_and_absence(any_store):
    doc = {"run": "r1", "stages": [{"name": "s1", "loss": 0.1 + 0.2, "ok": True, "uri": None}], "note": "ü"}
    uri = any_store.put_json("runs/r1/manifest.json", doc)
    assert uri == f"{any_store.uri}/runs/r1/manifest.json"
    assert any_store.get_json("runs/r1/manifest.json") == doc
    assert any_store.get_json("runs/r2/manifest.json") is None


def test_put_json_replaces_the_whole_document(any_store):
    any_store.put_json("d.json", {"a": 1, "b": 2})
    any_store.put_json("d.json", {"a": 3})
    assert any_store.get_json("d.json") == {"a": 3}


def test_stored_document_is_readable_json_with_its_checksum(any_store):
    any_store.put_json("d.json", {"b": 1, "a": [1.5]})
    envelope = json.loads(any_store.backend.read("d.json"))
    assert envelope["format"] == "ringzero.document"
    assert envelope["body"] == {"b": 1, "a": [1.5]}
    assert len(envelope["sha256"]) == 64


def test_an_edited_document_is_refused(any_store):
    any_store.put_json("runs/r1/manifest.json", {"status": "running", "stages": 1})
    data = any_store.backend.read("runs/r1/manifest.json")
    any_store.backend.write("runs/r1/manifest.json", data.replace(b'"stages": 1', b'"stages": 2'))
    with pytest.raises(
        IntegrityError,
        match=r"runs/r1/manifest.json: sha256 mismatch: expected [0-9a-f]{64}, "
        r"found [0-9a-f]{64}",
    ):
        any_store.get_json("runs/r1/manifest.json")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{truncated", r"d.json: not valid JSON"),
        (b'{"status": "raw json, no envelope"}', r"d.json: not a ringzero.document envelope"),
    ],
)
def test_objects_that_are_not_documents_are_refused(any_store, content, message):
    any_store.put_bytes("d.json", content)
    with pytest.raises(IntegrityError, match=message):
        any_store.get_json("d.json")


def test_unserializable_documents_are_refused_before_writing(any_store):
    with pytest.raises(StoreError, match=r"document 'd.json' is not JSON-serializable: Out of range float"):
        any_store.put_json("d.json", {"x": float("inf")})
    with pytest.raises(StoreError, match=r"is not JSON-serializable"):
        any_store.put_json("d.json", {"t": torch.ones(1)})
    assert any_store.get_bytes("d.json") is None


def test_bytes_round_trip_and_absence(any_store):
    payload = bytes(range(256)) * 10
    any_store.put_bytes("stages/h/metrics.jsonl", payload)
    assert any_store.get_bytes("stages/h/metrics.jsonl") == payload
    assert any_store.get_bytes("stages/h/other") is None


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("a/COMMITTED", r"COMMITTED is reserved for checkpoint markers"),
        ("a/STARTED", r"STARTED is reserved for checkpoint markers"),
        ("../x.json", r"segment '\.\.' is not allowed"),
        ("ck/config.json", r"object key 'ck/config.json' lies inside committed checkpoint .*/ck"),
    ],
)
def test_keys_that_would_forge_or_damage_checkpoints_are_refused(any_store, key, message):
    any_store.save("ck", {"w": torch.ones(1)}, {"keep": True})
    with pytest.raises(StoreError, match=message):
        any_store.put_json(key, {})
    with pytest.raises(StoreError, match=message):
        any_store.put_bytes(key, b"{}")
    assert any_store.load("ck").config == {"keep": True}
