"""``ClusterApi`` over the ``kubernetes`` package: a thin layer, no decisions here.

Imported only in cluster mode; the ``kubernetes`` package comes with the ``kfp`` extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ringzero.cluster.api import ObjectRef, WatchEvent
from ringzero.cluster.labels import OwnerRef

_IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubernetesApi:
    def __init__(self, api_client=None):
        from kubernetes import client, config, dynamic

        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self._client = api_client
        self._dynamic = dynamic.DynamicClient(api_client)
        self._core = client.CoreV1Api(api_client)

    def _resource(self, api_version: str, kind: str):
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    def create(self, obj: dict) -> dict:
        res = self._resource(obj["apiVersion"], obj["kind"])
        return res.create(body=obj, namespace=obj["metadata"]["namespace"]).to_dict()

    def get(self, ref: ObjectRef) -> dict | None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return (
                self._resource(ref.api_version, ref.kind)
                .get(name=ref.name, namespace=ref.namespace)
                .to_dict()
            )
        except NotFoundError:
            return None

    def watch(self, ref: ObjectRef, timeout_s: float) -> Iterator[WatchEvent]:
        res = self._resource(ref.api_version, ref.kind)
        for event in res.watch(
            namespace=ref.namespace,
            field_selector=f"metadata.name={ref.name}",
            timeout=max(1, int(timeout_s)),
        ):
            yield WatchEvent(event["type"], event["raw_object"])

    def delete(self, ref: ObjectRef) -> None:
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            self._resource(ref.api_version, ref.kind).delete(
                name=ref.name, namespace=ref.namespace, body={"propagationPolicy": "Background"}
            )
        except NotFoundError:
            pass

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        pods = self._core.list_namespaced_pod(namespace, label_selector=label_selector)
        return [self._client.sanitize_for_serialization(p) for p in pods.items]

    def log_tail(self, namespace: str, pod: str, container: str, lines: int) -> str:
        return self._core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=lines)

    def list_config_maps(self, namespace: str, label_selector: str) -> list[dict]:
        maps = self._core.list_namespaced_config_map(namespace, label_selector=label_selector)
        return [self._client.sanitize_for_serialization(m) for m in maps.items]

    def list_events(self, namespace: str, object_name: str) -> list[dict]:
        events = self._core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={object_name}"
        )
        out = [self._client.sanitize_for_serialization(e) for e in events.items]
        return sorted(out, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def list_nodes(self, label_selector: str) -> list[dict] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            nodes = self._core.list_node(label_selector=label_selector or None)
        except ApiException as exc:
            if exc.status in (401, 403):  # the chart grants it only with rbac.readCluster
                return None
            raise
        return [self._client.sanitize_for_serialization(n) for n in nodes.items]

    def get_crd(self, name: str) -> dict | None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from ringzero.cluster.versions import CrdUnreadable

        try:
            crd = client.ApiextensionsV1Api(self._client).read_custom_resource_definition(name)
        except ApiException as exc:
            if exc.status in (401, 403):  # the chart grants it only with rbac.readCluster
                raise CrdUnreadable(name) from None
            if exc.status == 404:
                return None
            raise
        return self._client.sanitize_for_serialization(crd)


def current_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (its service account's), else ``default`` outside a cluster."""
    try:
        return _IN_CLUSTER_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


def owner_from_env(environ) -> OwnerRef | None:
    """The pipeline step's own pod, from the downward-API variables RINGZERO_POD_NAME / RINGZERO_POD_UID."""
    name, uid = environ.get("RINGZERO_POD_NAME"), environ.get("RINGZERO_POD_UID")
    if not (name and uid):
        return None
    return OwnerRef(api_version="v1", kind="Pod", name=name, uid=uid)
