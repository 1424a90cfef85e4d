"""The launcher reads the training-job CRD before it creates anything and refuses a cluster whose CRD
lacks a field it sets (on Trainer v2.1 ``runtimePatches`` would be pruned silently and the pods would
start without their volumes), naming the version needed; skipped when the account may not read CRDs."""

from __future__ import annotations

import copy
import functools

import pytest
import yaml
from cluster_fakes import COMPLETE, FakeApi, FakeClock
from cluster_kit import SCHEMAS

from ringzero.cluster.job import StageJob
from ringzero.cluster.launch import launch_stage, render_stage
from ringzero.cluster.versions import CRDS, missing_fields
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError

IMAGES = {k: {"repository": f"r/{k}", "tag": "1"} for k in ("trainer", "rollout", "cpu")}
JOB = StageJob(
    run="r",
    stage="stage1",
    name="r-stage1-0a1b2c3d",
    namespace="ml",
    config_yaml="run: {name: r}\n",
    dp=1,
    cp=1,
)


def settings(backend: str) -> ClusterSettings:
    return ClusterSettings.model_validate(
        {
            "namespace": "ml",
            "images": IMAGES,
            "s3_secret": {"name": "s3"},
            "backend": backend,
            "gpus_per_node": 1,
        }
    )


@functools.cache
def shipped(kind: str) -> dict:
    """The upstream CRDs the manifests are validated against (Trainer v2.2+ TrainJob, Training Operator
    PyTorchJob)."""
    return yaml.safe_load((SCHEMAS / "crds" / f"{kind}.yaml").read_text())


def trainer_v2_1() -> dict:
    """The shipped TrainJob CRD as Kubeflow Trainer v2.1.0 served it: ``podTemplateOverrides`` where v2.2
    has ``runtimePatches``, and no ``activeDeadlineSeconds`` (read from the v2.1.0 tag's CRD)."""
    crd = copy.deepcopy(shipped("trainjobs"))
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        spec["podTemplateOverrides"] = spec.pop("runtimePatches")
        spec.pop("activeDeadlineSeconds")
    return crd


def walk(obj, prefix=""):
    """Every dotted path set in a rendered object (lists walked into their first element)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else key
            yield path
            yield from walk(value, path)
    elif isinstance(obj, list) and obj:
        yield from walk(obj[0], prefix)


@pytest.mark.parametrize(("backend", "kind"), [("trainjob", "TrainJob"), ("pytorchjob", "PyTorchJob")])
def test_the_checked_fields_are_the_top_fields_the_launcher_renders_and_the_shipped_crd_has_them(
    backend, kind
):
    want = CRDS[backend]
    (job,) = [o for o in render_stage(settings(backend), JOB) if o["kind"] == kind]
    rendered = set(walk(job))
    for path in want.fields:
        assert path in rendered, f"{path} is checked but the launcher does not set it"
    # every spec field directly under spec (and the trainer's / run policy's) that the launcher sets is
    # checked
    top = {p for p in rendered if p.count(".") == 1 and p.startswith("spec.")} - {
        "spec.pytorchReplicaSpecs",
        "spec.runtimeRef",
        "spec.trainer",
        "spec.runPolicy",
    }
    assert top <= set(want.fields)
    crd = shipped("trainjobs" if backend == "trainjob" else "pytorchjobs")
    assert crd["metadata"]["name"] == want.name
    assert missing_fields(crd, want) == []


def test_trainer_v2_1_is_refused_before_anything_is_created_naming_the_version():
    api = FakeApi({"TrainJob": [[COMPLETE]]}, crds={CRDS["trainjob"].name: trainer_v2_1()})
    with pytest.raises(RingzeroError) as err:
        launch_stage(api, settings("trainjob"), JOB, clock=FakeClock())
    message = str(err.value)
    assert (
        "trainjobs.trainer.kubeflow.org CRD lacks spec.runtimePatches, spec.activeDeadlineSeconds" in message
    )
    assert "Kubeflow Trainer v2.2 or newer" in message and "nothing was created" in message
    assert api.created == []


def test_a_missing_crd_or_version_is_refused():
    api = FakeApi({"TrainJob": [[COMPLETE]]}, crds={})
    with pytest.raises(RingzeroError, match="the cluster has no trainjobs.trainer.kubeflow.org CRD"):
        launch_stage(api, settings("trainjob"), JOB, clock=FakeClock())
    crd = copy.deepcopy(shipped("trainjobs"))
    for version in crd["spec"]["versions"]:
        version["name"] = "v1beta1"
    assert missing_fields(crd, CRDS["trainjob"]) == ["version v1alpha1 (served: ['v1beta1'])"]
    assert api.created == []


def test_a_current_crd_launches_and_an_unreadable_one_is_skipped():
    for crds in ({CRDS["trainjob"].name: shipped("trainjobs")}, None):
        api = FakeApi({"TrainJob": [[COMPLETE]]}, crds=crds)
        launch_stage(api, settings("trainjob"), JOB, clock=FakeClock())
        assert api.created == ["ConfigMap", "TrainJob"]
    succeeded = {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    api = FakeApi({"PyTorchJob": [[succeeded]]}, crds={CRDS["pytorchjob"].name: shipped("pytorchjobs")})
    launch_stage(api, settings("pytorchjob"), JOB, clock=FakeClock())
    assert api.created == ["ConfigMap", "PyTorchJob"]


def test_the_kubernetes_client_reads_the_crd_and_tells_absent_from_forbidden():
    """``KubernetesApi.get_crd`` against a stand-in API server: the CRD as served, None for 404, and
    ``CrdUnreadable`` (check skipped) for 403."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from kubernetes import client

    from ringzero.cluster.kube import KubernetesApi
    from ringzero.cluster.versions import CrdUnreadable

    answers = {"trainjobs.trainer.kubeflow.org": (200, trainer_v2_1()), "pytorchjobs.kubeflow.org": (403, {})}
    paths = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            paths.append(self.path)
            status, body = answers.get(self.path.rsplit("/", 1)[-1], (404, {"kind": "Status", "code": 404}))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
        api = object.__new__(KubernetesApi)  # no discovery: get_crd uses the typed client only
        api._client = client.ApiClient(config)
        crd = api.get_crd("trainjobs.trainer.kubeflow.org")
        assert missing_fields(crd, CRDS["trainjob"]) == ["spec.runtimePatches", "spec.activeDeadlineSeconds"]
        assert api.get_crd("nope.example.org") is None
        with pytest.raises(CrdUnreadable):
            api.get_crd("pytorchjobs.kubeflow.org")
        assert (
            paths[0]
            == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org"
        )
    finally:
        server.shutdown()
