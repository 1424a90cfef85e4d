"""The rollout pod's init container: a committed checkpoint from the store becomes a plain HF folder."""

from __future__ import annotations

import json
import socket
import uuid

import pytest
import safetensors.torch
import torch
from minio import Minio

from ringzero.cluster import fetch_model
from ringzero.store import open_store
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV
from ringzero.store.manifest import STARTED_FILE

TENSORS = {"model.embed_tokens.weight": torch.randn(8, 4), "lm_head.weight": torch.randn(8, 4)}
CONFIG = {"architectures": ["BailingMoeV2_5ForCausalLM"], "hidden_size": 4}
EXTRAS = {"generation_config.json": b'{"eos_token_id": 1}', "tokenizer.json": b'{"model": {}}'}
HF_FILES = [
    "config.json",
    "generation_config.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
]


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = fetch_model.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop()


def test_fetch_writes_a_plain_hf_folder_from_s3(moto_endpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ACCESS_KEY_ENV, "fetch-access")
    monkeypatch.setenv(SECRET_KEY_ENV, "fetch-secret")
    bucket = f"ringzero-fetch-{uuid.uuid4().hex[:8]}"
    Minio(moto_endpoint, "fetch-access", "fetch-secret", secure=False).make_bucket(bucket)
    from ringzero.store.config import S3Settings

    store = open_store(f"s3://{bucket}/runs/r", S3Settings(endpoint=moto_endpoint), max_shard_bytes=200)
    uri = store.save("base", TENSORS, CONFIG, extra_files=EXTRAS)
    dest = tmp_path / "models" / "policy"

    code, out, err = run(capsys, uri, dest, "--endpoint", moto_endpoint)

    assert code == 0, err
    assert out.splitlines()[-1] == f"fetched {len(HF_FILES)} files from {uri} to {dest}"
    assert sorted(p.name for p in dest.iterdir()) == HF_FILES
    assert json.loads((dest / "config.json").read_text()) == CONFIG
    weight_map = json.loads((dest / "model.safetensors.index.json").read_text())["weight_map"]
    loaded = {
        k: v for f in set(weight_map.values()) for k, v in safetensors.torch.load_file(dest / f).items()
    }
    assert all(torch.equal(loaded[k], v) for k, v in TENSORS.items()) and loaded.keys() == TENSORS.keys()


def test_fetch_refuses_an_uncommitted_checkpoint_and_writes_nothing(tmp_path, capsys):
    store = open_store(f"file://{tmp_path}/store")
    store.backend.write(f"base/{STARTED_FILE}", b"{}")
    code, out, err = run(capsys, store.uri_of("base"), tmp_path / "policy")
    assert (code, out) == (2, "")
    assert "a save of it started but never committed" in err
    assert not (tmp_path / "policy").exists()


def test_fetch_refuses_a_corrupted_file_naming_it(tmp_path, capsys):
    store = open_store(f"file://{tmp_path}/store")
    uri = store.save("base", TENSORS, CONFIG, extra_files=EXTRAS)
    (store.backend.root / "base" / "tokenizer.json").write_bytes(b'{"model": []}')
    code, _, err = run(capsys, uri, tmp_path / "policy")
    assert code == 2
    assert f"error: {uri}/tokenizer.json: sha256 mismatch: expected " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["s3://bucket/runs/base", "{tmp}/policy"], "give the S3 endpoint with --endpoint HOST:PORT"),
        (
            ["s3://bucket/runs/base", "{tmp}/policy", "--endpoint", "http://h:9"],
            "bad S3 settings: Value error, give host:port without a scheme",
        ),
        (["http://host/x", "{tmp}/policy"], "is not a store URI"),
        (["s3://bucket", "{tmp}/policy", "--endpoint", "h:9"], "names no checkpoint folder"),
    ],
)
def test_bad_arguments_are_one_clean_line(tmp_path, capsys, argv, message):
    code, _, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2
    assert message in err and "Traceback" not in err


def test_fetch_refuses_a_non_empty_destination(tmp_path, capsys):
    uri = open_store(f"file://{tmp_path}/store").save("base", TENSORS, CONFIG)
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "stale.safetensors").write_bytes(b"old")
    code, _, err = run(capsys, uri, tmp_path / "policy")
    assert code == 2
    assert f"cannot export to {tmp_path / 'policy'}: the folder exists and is not empty" in err
