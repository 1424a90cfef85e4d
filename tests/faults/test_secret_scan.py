"""Secrets never leave the credential files: a whole micro pipeline (pretrain, RL, eval) runs against an
S3 server with known, distinctive credentials, and every byte the project writes or prints is scanned
for them (plain, base64 and URL-encoded): the run's console output, every file of its run folder (log
lines, metric records, manifest, HTML report), every object it put in the bucket (checkpoints, their
manifests, outcomes, metrics, the run manifest), the compiled Kubeflow pipeline of the same config, and
the Helm chart rendered for it. ``ringzero serve`` with the same credentials is scanned too: its log and
answers after requests that fail, weight updates the store client cannot load among them. The scan itself
is checked on a document that does hold the key."""

from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("secret-scan")]

MICRO_MODEL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "layout": "LM",
    "intermediate_size": 64,
    "max_position_embeddings": 96,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "head_dim": 8,
    "lightning_block_size": 16,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forms(value: str) -> list[bytes]:
    raw = value.encode()
    return [raw, base64.b64encode(raw), urllib.parse.quote(value, safe="").encode()]


def leaks(blob: bytes, keys: list[str]) -> list[str]:
    return [k[:4] + "..." for k in keys for form in forms(k) if form in blob]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # distinctive values: no other text of the run can contain them by chance
    keys = {
        "access": "RZSCAN" + secrets.token_hex(8).upper(),
        "secret": "rzscan/" + secrets.token_urlsafe(30),
    }
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name="us-east-1",
        aws_access_key_id=keys["access"],
        aws_secret_access_key=keys["secret"],
    )
    client.create_bucket(Bucket="scan")
    yield {"endpoint": f"127.0.0.1:{port}", "keys": keys, "client": client}
    server.stop()


def test_the_scan_finds_a_key_in_any_of_its_forms():
    key = "rzscan/" + secrets.token_urlsafe(30)
    for form in forms(key):
        assert leaks(b"...header " + form + b" trailer", [key])
    assert not leaks(b"nothing here", [key])


def credentials_env(s3) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RINGZERO_S3_ACCESS_KEY": s3["keys"]["access"],
        "RINGZERO_S3_SECRET_KEY": s3["keys"]["secret"],
    }


def scan_config(tmp_path, s3):
    """A micro run (pretrain, RL, eval) whose store is the module's S3 bucket."""
    config = tmp_path / "scan.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "scan", "seed": 0, "run_dir": str(tmp_path / "run"), "threads": 1},
                "model": MICRO_MODEL,
                "task": {"kind": "arithmetic", "operation": "digitsum", "digits": 2, "eval_prompts": 4},
                "precision": {"train": "fp32", "rollout": "fp32"},
                "storage": {"root": "s3://scan/runs", "s3": {"endpoint": s3["endpoint"], "secure": False}},
                "kfp": {
                    "base_image": "registry.example/ringzero:0.1.0",
                    "s3_secret": {"name": "ringzero-s3"},
                },
                "stages": [
                    {
                        "name": "base",
                        "kind": "pretrain",
                        "steps": 8,
                        "batch_size": 4,
                        "seq_len": 32,
                        "checkpoint_every": 4,
                    },
                    {
                        "name": "stage1",
                        "kind": "rl",
                        "steps": 2,
                        "prompts_per_step": 2,
                        "samples_per_prompt": 2,
                        "minibatches": 1,
                        "checkpoint_every": 1,
                        "min_steps": 0,
                        "sampling": {"max_new_tokens": 8},
                    },
                    {
                        "name": "eval",
                        "kind": "eval",
                        "prompts": 4,
                        "k": 2,
                        "sampling": {"max_new_tokens": 8},
                        "compare": ["base", "stage1"],
                    },
                ],
            },
            sort_keys=False,
        )
    )
    return config


def test_no_credential_appears_in_anything_the_run_writes_or_prints(s3, tmp_path):
    keys = list(s3["keys"].values())
    config = scan_config(tmp_path, s3)
    env = credentials_env(s3)
    run = subprocess.run(
        [sys.executable, "-m", "ringzero.cli.main", "run", str(config)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:].decode(errors="replace")
    found: dict[str, list[str]] = {}

    def scan(where: str, blob: bytes) -> None:
        if hit := leaks(blob, keys):
            found[where] = hit

    scan("console", run.stdout + run.stderr)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {"log.jsonl", "manifest.json", "report.html"} <= {p.name for p in files}
    assert any(p.name == "metrics.jsonl" for p in files)
    for p in files:
        scan(str(p.relative_to(tmp_path)), p.read_bytes())

    objects = [
        o["Key"]
        for page in s3["client"].get_paginator("list_objects_v2").paginate(Bucket="scan")
        for o in page.get("Contents", [])
    ]
    assert any(k.endswith(".safetensors") for k in objects) and any(
        k.endswith("outcome.json") for k in objects
    )
    assert any(k.endswith("/manifest.json") and "/runs/scan/" in "/" + k for k in objects)
    for key in objects:
        scan(f"s3://scan/{key}", s3["client"].get_object(Bucket="scan", Key=key)["Body"].read())

    pipeline = tmp_path / "scan.pipeline.yaml"
    compiled = subprocess.run(
        [sys.executable, "-m", "ringzero.cli.main", "kfp", "compile", str(config), "--output", str(pipeline)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stderr[-2000:].decode(errors="replace")
    assert b"RINGZERO_S3_SECRET_KEY_FILE" in pipeline.read_bytes()  # the compiled steps do read credentials
    scan("compiled pipeline", pipeline.read_bytes() + compiled.stdout + compiled.stderr)

    from cluster_helm_cli import HelmUnavailable, helm_binary

    try:
        helm = helm_binary()
    except HelmUnavailable as exc:
        pytest.fail(f"the chart cannot be rendered: {exc}")
    chart = subprocess.run(
        [
            str(helm),
            "template",
            "rz",
            str(ROOT / "helm" / "ringzero"),
            "--namespace",
            "scan",
            "--set",
            "minio.enabled=false",
            "--set",
            f"s3.endpoint={s3['endpoint']}",
            "--set",
            "s3.secure=false",
        ],
        capture_output=True,
        env=env,
        timeout=120,
    )
    assert chart.returncode == 0, chart.stderr.decode(errors="replace")
    assert b"RINGZERO_S3_SECRET_KEY_FILE" in chart.stdout
    scan("rendered chart", chart.stdout + chart.stderr)

    assert not found, f"credentials found in: {found}"


def test_no_credential_appears_in_the_logs_of_failed_requests(s3, tmp_path):
    """``ringzero serve`` with the run's S3 settings and credentials, asked what it must refuse or fail:
    weight updates the store client cannot load (no such checkpoint, no such bucket), text the tokenizer
    cannot encode, a prompt longer than the context, broken bodies. Its console log and every answer are
    scanned."""
    import requests

    keys = list(s3["keys"].values())
    port, log = free_port(), tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ringzero.cli.main",
                "serve",
                "--init",
                "random",
                "--config",
                str(scan_config(tmp_path, s3)),
                "--port",
                str(port),
                "--precision",
                "fp32",
            ],
            cwd=ROOT,
            env=credentials_env(s3),
            stdout=stderr,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    failing = [
        ("/update_weights_from_disk", {"model_path": "s3://scan/runs/no-such-checkpoint"}),
        ("/update_weights_from_disk", {"model_path": "s3://no-such-bucket/checkpoints/step-1"}),
        ("/generate", {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 4}}),
        ("/v1/completions", {"prompt": "Paris", "max_tokens": 4}),
        ("/generate", {"input_ids": [5] * (MICRO_MODEL["max_position_embeddings"] + 4)}),
        ("/generate", "{not json"),
        ("/generate", '{"text": "a\\ud800", "rid": "x"}'),
    ]
    answers = []
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.2)
        for path, body in failing:
            kwargs = {"data": body} if isinstance(body, str) else {"json": body}
            resp = requests.post(url + path, timeout=120, **kwargs)
            assert resp.status_code == 400, (path, body, resp.text)
            answers.append(resp.content)
        assert b"rollout.weight_update_failed" in log.read_bytes()
    finally:
        proc.terminate()
        proc.wait(30)
    found = {
        where: hit
        for where, blob in (("serve console", log.read_bytes()), ("answers", b"".join(answers)))
        if (hit := leaks(blob, keys))
    }
    assert not found, f"credentials found in: {found}"
