"""``ringzero kfp``: compile writes the spec; submit refuses what pods cannot use and names the endpoint."""

import socket

import pytest
import yaml
from kfp_kit import micro_config

from ringzero.cli.main import main

pytestmark = pytest.mark.xdist_group("kfp")

S3_KFP = {"s3_secret": {"name": "ringzero-s3"}}


def test_compile_writes_the_pipeline(tmp_path, capsys):
    out = tmp_path / "out" / "micro.yaml"
    assert main(["kfp", "compile", str(micro_config(tmp_path, gate=[])), "--output", str(out)]) == 0
    assert yaml.safe_load_all(out.read_text()).__next__()["pipelineInfo"]["name"] == "micro"
    assert "4 stages" in capsys.readouterr().out


def test_submit_refuses_a_file_store(tmp_path, capsys):
    config = micro_config(tmp_path, gate=[], kfp=S3_KFP)
    assert main(["kfp", "submit", "--host", "http://127.0.0.1:9", str(config)]) == 2
    assert "separate pods, which share no filesystem" in capsys.readouterr().err


def test_submit_refuses_an_s3_store_without_credentials(tmp_path, capsys):
    config = micro_config(tmp_path, gate=[], storage="s3://bucket/runs")
    assert main(["kfp", "submit", "--host", "http://127.0.0.1:9", str(config)]) == 2
    assert "kfp.s3_secret is not set" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_submit_to_an_unreachable_endpoint_names_it(tmp_path, capsys):
    host = f"http://127.0.0.1:{_closed_port()}"
    config = micro_config(tmp_path, gate=[], kfp=S3_KFP, storage="s3://bucket/runs")
    assert main(["kfp", "submit", "--host", host, str(config)]) == 2
    assert f"error: KFP at {host}: could not submit run 'micro'" in capsys.readouterr().err
