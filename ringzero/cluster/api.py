"""The client boundary: the few Kubernetes calls the launcher makes, as a protocol.

``kube.KubernetesApi`` implements it with the ``kubernetes`` package; tests implement it with a
scripted fake, so every wait, failure and cleanup path is exercised without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ObjectRef:
    api_version: str
    kind: str
    name: str
    namespace: str

    @classmethod
    def of(cls, obj: dict) -> ObjectRef:
        meta = obj["metadata"]
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta["namespace"])

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED
    object: dict


class ClusterApi(Protocol):
    def create(self, obj: dict) -> dict:
        """Create the object; returns it as stored by the server."""

    def get(self, ref: ObjectRef) -> dict | None:
        """The object, or None if it does not exist."""

    def watch(self, ref: ObjectRef, timeout_s: float) -> Iterator[WatchEvent]:
        """Changes of one object; the stream may end early (server-side timeout), callers re-watch."""

    def delete(self, ref: ObjectRef) -> None:
        """Delete with background propagation; an object already gone is not an error."""

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        """Pods matching the selector, as plain dicts."""

    def log_tail(self, namespace: str, pod: str, container: str, lines: int) -> str:
        """The last ``lines`` lines of one container's log."""

    def list_events(self, namespace: str, object_name: str) -> list[dict]:
        """Events about one object (a pod), oldest first, as plain dicts."""

    def list_nodes(self, label_selector: str) -> list[dict] | None:
        """Nodes matching the selector, as plain dicts; None when this account may not read nodes."""

    def get_crd(self, name: str) -> dict | None:
        """A CustomResourceDefinition by name, None when it is not installed; raises ``CrdUnreadable``
        (ringzero.cluster.versions) when this account may not read CRDs."""
