"""The small programs cluster pods run: read store credentials, upload the pipeline, check an installation.

Fetching a checkpoint is tested in test_cluster_fetch_model.py."""

from __future__ import annotations

import socket

import pytest

from ringzero.cluster import fetch_model, kfp_upload, smoke
from ringzero.errors import RingzeroError


class FakeBucket:
    """The one bucket call the install check makes."""

    def bucket_exists(self, bucket):
        return bucket == "ringzero"


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
    assert "already has version" in kfp_upload.upload(
        FakeKfp(existing="pid-1", conflict=True), package, "ringzero"
    )


def test_upload_reports_a_missing_package(tmp_path, capsys):
    assert kfp_upload.main([str(tmp_path / "nope.yaml"), "--host", "http://kfp", "--name", "n"]) == 2
    assert "did `ringzero kfp compile` run?" in capsys.readouterr().err


def test_rendezvous_reads_either_operator():
    trainer = {
        "PET_MASTER_ADDR": "node-0",
        "PET_MASTER_PORT": "29500",
        "PET_NODE_RANK": "1",
        "PET_NNODES": "2",
    }
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
    assert "reachable" in smoke.check_bucket(FakeBucket(), "ringzero")
    with pytest.raises(RingzeroError, match="does not exist"):
        smoke.check_bucket(FakeBucket(), "missing")
