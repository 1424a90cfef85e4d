"""The small programs cluster pods run: fetch a checkpoint, upload the pipeline, check an installation."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from ringzero.cluster import fetch_model, kfp_upload, smoke
from ringzero.errors import RingzeroError


@dataclass
class Obj:
    object_name: str
    size: int
    is_dir: bool = False


class FakeBucket:
    def __init__(self, files: dict[str, bytes], short: str | None = None):
        self.files, self.short = files, short

    def list_objects(self, bucket, prefix, recursive):
        assert recursive
        return [Obj(k, len(v)) for k, v in self.files.items() if k.startswith(prefix)]

    def fget_object(self, bucket, name, path):
        data = self.files[name]
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data[:-1] if name == self.short else data)

    def bucket_exists(self, bucket):
        return bucket == "ringzero"


CKPT = {"runs/r/base/model-00001.safetensors": b"x" * 100, "runs/r/base/config.json": b"{}",
        "runs/r/base/manifest.json": b"{}", "runs/r/base/COMMITTED": b"", "runs/r/base2/other": b"no"}


def test_fetch_copies_a_committed_checkpoint(tmp_path):
    names = fetch_model.fetch(FakeBucket(CKPT), "s3://ringzero/runs/r/base", tmp_path / "policy")
    assert names == ["COMMITTED", "config.json", "manifest.json", "model-00001.safetensors"]
    assert (tmp_path / "policy" / "model-00001.safetensors").read_bytes() == b"x" * 100
    assert not (tmp_path / "policy" / "other").exists()


def test_fetch_refuses_an_uncommitted_checkpoint(tmp_path):
    files = {k: v for k, v in CKPT.items() if not k.endswith("COMMITTED")}
    with pytest.raises(RingzeroError, match="no COMMITTED marker"):
        fetch_model.fetch(FakeBucket(files), "s3://ringzero/runs/r/base", tmp_path)


def test_fetch_refuses_a_short_download(tmp_path):
    bucket = FakeBucket(CKPT, short="runs/r/base/model-00001.safetensors")
    with pytest.raises(RingzeroError, match="got 99 bytes, the store lists 100"):
        fetch_model.fetch(bucket, "s3://ringzero/runs/r/base", tmp_path)


@pytest.mark.parametrize("uri", ["file:///tmp/x", "s3://", "s3://bucket", "s3://bucket/"])
def test_fetch_refuses_bad_uris(uri, tmp_path):
    with pytest.raises(RingzeroError, match="s3://BUCKET/PREFIX"):
        fetch_model.fetch(FakeBucket({}), uri, tmp_path)


def test_credentials_come_from_env_or_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert fetch_model.credential("K", {"K": "direct"}) == "direct"
    assert fetch_model.credential("K", {"K_FILE": str(key_file)}) == "from-file"
    with pytest.raises(RingzeroError, match="set K or K_FILE"):
        fetch_model.credential("K", {})


class FakeKfp:
    def __init__(self, existing: str | None = None, conflict: bool = False):
        self.existing, self.conflict, self.calls = existing, conflict, []

    def get_pipeline_id(self, name):
        return self.existing

    def upload_pipeline(self, path, pipeline_name, description):
        self.calls.append(("pipeline", pipeline_name))

    def upload_pipeline_version(self, path, pipeline_version_name, pipeline_id):
        if self.conflict:
            raise RuntimeError("(409) Conflict: version already exists")
        self.calls.append(("version", pipeline_version_name, pipeline_id))


def test_upload_creates_then_versions_by_content(tmp_path):
    package = tmp_path / "pipeline.yaml"
    package.write_text("pipelineSpec: 1\n")
    first = FakeKfp()
    assert kfp_upload.upload(first, package, "ringzero") == "created pipeline 'ringzero'"
    later = FakeKfp(existing="pid-1")
    kfp_upload.upload(later, package, "ringzero")
    version = later.calls[0][1]
    package.write_text("pipelineSpec: 2\n")
    kfp_upload.upload(later, package, "ringzero")
    assert later.calls[1][1] != version and later.calls[1][2] == "pid-1"
    assert "already has version" in kfp_upload.upload(FakeKfp(existing="pid-1", conflict=True), package, "ringzero")


def test_upload_reports_a_missing_package(tmp_path, capsys):
    assert kfp_upload.main([str(tmp_path / "nope.yaml"), "--host", "http://kfp", "--name", "n"]) == 2
    assert "did `ringzero kfp compile` run?" in capsys.readouterr().err


def test_rendezvous_reads_either_operator():
    trainer = {"PET_MASTER_ADDR": "node-0", "PET_MASTER_PORT": "29500", "PET_NODE_RANK": "1", "PET_NNODES": "2"}
    operator = {"MASTER_ADDR": "master-0", "MASTER_PORT": "23456", "RANK": "0", "WORLD_SIZE": "3"}
    assert smoke.rendezvous(trainer) == ("node-0", 29500, 1, 2)
    assert smoke.rendezvous(operator) == ("master-0", 23456, 0, 3)
    with pytest.raises(RingzeroError, match="inside a training job"):
        smoke.rendezvous({})


def test_smoke_all_reduce_on_one_cpu_node():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"}
    assert "gloo all-reduce ok" in smoke.check_allreduce(env, expect_gpus=0)


def test_smoke_names_missing_gpus_and_buckets():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "0", "WORLD_SIZE": "1"}
    with pytest.raises(RingzeroError, match="expected 8"):
        smoke.check_allreduce(env, expect_gpus=8)
    assert "reachable" in smoke.check_bucket(FakeBucket({}), "ringzero")
    with pytest.raises(RingzeroError, match="does not exist"):
        smoke.check_bucket(FakeBucket({}), "missing")
