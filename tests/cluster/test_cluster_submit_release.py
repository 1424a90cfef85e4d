"""``ringzero kfp submit --release NAME``: a run submitted from a shell is the run the release's uploaded
pipeline starts from the UI. The release's settings come from its ConfigMaps (as `helm template` renders
them, served by a stand-in cluster API); the KFP side is a local server answering with the API's
responses (tests/cluster/recorded/: healthz, the experiment lookup, the created run), and the test reads
what the client sent."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cluster_kit import COMBINATIONS, NAMESPACE, RELEASE, render

from ringzero.cli.main import main

RECORDED = Path(__file__).parent / "recorded"


class KfpApi:
    """The KFP v2beta1 endpoints a submit calls, answered from the recorded responses; requests kept."""

    def __init__(self):
        self.requests: list[tuple[str, str, dict | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                api.requests.append((self.command, self.path.split("?")[0], body))
                name = {
                    ("GET", "/apis/v2beta1/healthz"): "healthz",
                    ("GET", "/apis/v2beta1/experiments"): "experiments",
                    ("POST", "/apis/v2beta1/runs"): "run",
                }.get((self.command, self.path.split("?")[0]))
                data = (
                    (RECORDED / f"kfp-v2beta1-{name}.json").read_bytes()
                    if name
                    else b'{"error": "not found"}'
                )
                self.send_response(200 if name else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


class ReleaseApi:
    """The cluster API as `from_release` uses it: ConfigMaps by label, from the rendered chart."""

    def __init__(self, objects):
        self.config_maps = [o for o in objects if o["kind"] == "ConfigMap"]
        self.asked: list[tuple[str, str]] = []

    def list_config_maps(self, namespace, label_selector):
        self.asked.append((namespace, label_selector))
        wanted = dict(part.split("=") for part in label_selector.split(","))
        return [
            m
            for m in self.config_maps
            if m["metadata"]["namespace"] == namespace
            and all(m["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        ]


@pytest.fixture
def kfp_api():
    api = KfpApi()
    yield api
    api.server.shutdown()


def submit(monkeypatch, objects, *args):
    release_api = ReleaseApi(objects)
    monkeypatch.setattr("ringzero.cluster.kube.KubernetesApi", lambda: release_api)
    code = main(["kfp", "submit", *args])
    return code, release_api


def test_the_notes_command_submits_the_release_s_run_as_its_service_account(
    helm_bin, monkeypatch, kfp_api, capsys
):
    objects = render(helm_bin, COMBINATIONS["gpu-2node"])
    code, release_api = submit(
        monkeypatch,
        objects,
        "--release",
        RELEASE,
        "--release-namespace",
        NAMESPACE,
        "--host",
        kfp_api.url,
        "cluster-h200.yaml",
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "as service account rz-ringzero: run id 0b8e5d52-7c34-4a18-9f0e-3d2a61c4b9f7" in out.out
    assert [(m, p) for m, p, _ in kfp_api.requests] == [
        ("GET", "/apis/v2beta1/healthz"),
        ("GET", "/apis/v2beta1/experiments"),
        ("POST", "/apis/v2beta1/runs"),
    ]
    run = kfp_api.requests[-1][2]
    assert run["service_account"] == "rz-ringzero"
    assert run["experiment_id"] == "6d41c1a4-2b0c-4f3c-9d1e-5b8f0c0a7e11"
    spec = run["pipeline_spec"]["pipeline_spec"]  # beside it, platform_spec: the Secret mounts
    images = {e["container"]["image"] for e in spec["deploymentSpec"]["executors"].values()}
    assert images == {"ringzero/cpu:0.1.0"}  # steps run the release's step image
    text = json.dumps(spec)
    # the release's store, Secret, cluster settings and its profile's parallel dims travel in the spec
    assert "s3://ringzero/runs/cluster-h200" in text and "ringzero-s3" in text
    assert "rz-ringzero-minio.ml.svc:9000" in text
    assert all(
        (NAMESPACE, s) in release_api.asked
        for s in (
            "app.kubernetes.io/instance=rz,app.kubernetes.io/component=cluster-settings",
            "app.kubernetes.io/instance=rz,app.kubernetes.io/component=run-configs",
        )
    )


def test_the_submitted_config_is_the_one_the_release_ships_with_its_profile_overrides(
    helm_bin, monkeypatch, kfp_api
):
    objects = render(helm_bin, COMBINATIONS["gpu-2node"])
    code, _ = submit(
        monkeypatch,
        objects,
        "--release",
        RELEASE,
        "--release-namespace",
        NAMESPACE,
        "--host",
        kfp_api.url,
        "cluster-h200.yaml",
    )
    assert code == 0
    spec = kfp_api.requests[-1][2]["pipeline_spec"]
    configs = [v for v in _strings(spec) if v.startswith("{") and '"parallel"' in v]
    assert configs, "the run config is not in the pipeline spec"
    cfg = json.loads(configs[0])
    assert (cfg["parallel"]["dp"], cfg["parallel"]["cp"]) == (2, 4)  # values-gpu-2node's pipeline override
    assert cfg["kfp"]["service_account"] == "rz-ringzero" and cfg["kfp"]["mode"] == "cluster"
    assert cfg["cluster"]["rollout"]["replicas"] == 2


def _strings(node):
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)


def test_an_unknown_release_or_run_config_is_named(helm_bin, monkeypatch, kfp_api, capsys):
    objects = render(helm_bin, COMBINATIONS["gpu"])
    code, _ = submit(
        monkeypatch,
        objects,
        "--release",
        "other",
        "--release-namespace",
        NAMESPACE,
        "--host",
        kfp_api.url,
        "cluster-h200.yaml",
    )
    assert code == 2
    assert "release 'other' in namespace 'ml': no ConfigMaps labelled" in capsys.readouterr().err
    code, _ = submit(
        monkeypatch,
        objects,
        "--release",
        RELEASE,
        "--release-namespace",
        NAMESPACE,
        "--host",
        kfp_api.url,
        "my-run.yaml",
    )
    assert code == 2
    assert (
        "my-run.yaml: no such file here, nor a run config of the release (cluster-h200.yaml)"
        in capsys.readouterr().err
    )
    assert not kfp_api.requests  # nothing was submitted


def test_the_command_notes_prints_runs_as_printed(helm_bin, monkeypatch, kfp_api, capsys):
    import shlex

    from cluster_kit import CHART, helm

    files = COMBINATIONS["gpu"]
    args = ["install", "--dry-run", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in files:
        args += ["-f", str(CHART / f)]
    done = helm(helm_bin, *args)
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    [line] = [x.strip() for x in notes.splitlines() if x.strip().startswith("ringzero kfp submit")]
    argv = shlex.split(line)
    assert argv[argv.index("--host") + 1] == "http://localhost:8888"  # the port-forward NOTES starts
    argv[argv.index("--host") + 1] = kfp_api.url  # here the stand-in KFP API takes its place
    code, _ = submit(monkeypatch, render(helm_bin, files), *argv[3:])
    assert code == 0, capsys.readouterr().err
    assert kfp_api.requests[-1][2]["service_account"] == "rz-ringzero"
