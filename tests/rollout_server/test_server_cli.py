"""``ringzero serve`` as a user runs it: a subprocess on a free loopback port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from server_kit import TINY

pytestmark = pytest.mark.xdist_group("rollout_server")

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ringzero(*args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ringzero.cli.main", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, limit_s: float = 120.0) -> None:
    """Poll /health; the limit only keeps a server that never starts from hanging the suite."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}: {log.read_text()}")
        try:
            if requests.get(url + "/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise AssertionError("serve never became healthy")


def test_serve_random_init_answers_generate(tmp_path):
    config = tmp_path / "model.yaml"
    config.write_text(json.dumps({"model": TINY}))  # JSON is YAML
    port, log = free_port(), tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = ringzero(
            "serve",
            "--init",
            "random",
            "--config",
            str(config),
            "--port",
            str(port),
            "--precision",
            "fp32",
            "--seed",
            "3",
            stderr=stderr,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        info = requests.get(url + "/get_model_info", timeout=10).json()
        assert (info["model_path"], info["tokenizer_path"], info["weight_version"]) == (
            "random://seed-3",
            "char",
            "0",
        )
        out = requests.post(
            url + "/generate",
            json={"text": "1+1=", "sampling_params": {"max_new_tokens": 3}, "return_logprob": True},
            timeout=60,
        ).json()
        assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 3
        assert len(out["meta_info"]["output_token_logprobs"]) == len(out["output_ids"])
    finally:
        proc.terminate()
        proc.wait(30)


def test_exported_folder_is_served_with_its_own_tokenizer(tmp_path):
    """``ringzero export --init random --config configs/tiny-cpu.yaml DIR`` then ``serve --model-path DIR``,
    as ``sglang.launch_server --model-path DIR`` takes a folder."""
    folder = tmp_path / "exported"
    export = subprocess.run(
        [
            sys.executable,
            "-m",
            "ringzero.cli.main",
            "export",
            "--init",
            "random",
            "--config",
            "configs/tiny-cpu.yaml",
            str(folder),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert export.returncode == 0, export.stderr
    port, log = free_port(), tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = ringzero(
            "serve", "--model-path", str(folder), "--port", str(port), "--precision", "fp32", stderr=stderr
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log)
        info = requests.get(url + "/get_model_info", timeout=10).json()
        assert (info["model_path"], info["tokenizer_path"]) == (str(folder), str(folder / "tokenizer.json"))
        out = requests.post(
            url + "/generate",
            json={
                "text": "q: 1+2 ",
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                "return_logprob": True,
            },
            timeout=60,
        ).json()
        assert out["meta_info"]["prompt_tokens"] == 7 and len(out["output_ids"]) == 4
        # SGLang's own test prompt: the exported vocabulary has no capitals and no unknown token
        refused = requests.post(
            url + "/generate",
            json={
                "text": "The capital of France is",
                "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            },
            timeout=60,
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["message"] == (
            "text: 'T' at position 0 and 'F' at position 15 are not in "
            "the tokenizer's vocabulary, which has no unknown token"
        )
        info = requests.get(url + "/get_server_info", timeout=10).json()
        # configs/tiny-cpu.yaml: 512 positions; serve's default --max-batch: 64 rows
        assert (info["max_total_num_tokens"], info["max_running_requests"], info["context_length"]) == (
            64 * 512,
            64,
            512,
        )
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_random_init_without_a_config_is_refused():
    proc = ringzero("serve", "--init", "random")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "needs --config with a model section" in err


def test_serve_needs_a_weight_source():
    proc = ringzero("serve")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "--checkpoint" in err and "--init" in err
