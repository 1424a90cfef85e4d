"""A scripted fake of the launcher's client boundary, and a clock that advances on every reading."""

from __future__ import annotations

from ringzero.cluster.api import ObjectRef, WatchEvent

RUNNING = {"status": {"conditions": [{"type": "Created", "status": "True"}]}}
COMPLETE = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
FAILED = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailed",
                                     "message": "node-0 exited with code 1"}]}}
READY = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
         "status": {"observedGeneration": 1, "availableReplicas": 1}}


class FakeClock:
    """Each reading advances time by ``step`` seconds, so a wait that never ends reaches its deadline."""

    def __init__(self, step: float = 10.0):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class FakeApi:
    """Per kind: a list of watch streams; each stream is a list of status patches, "DELETED", or a callable
    (run when reached: raise KeyboardInterrupt, send a signal...). ``get`` returns the latest state."""

    def __init__(self, streams: dict[str, list[list]], pods=(), logs=None, fail_create=(), fail_delete=()):
        self.streams = {k: list(v) for k, v in streams.items()}
        self.state: dict[ObjectRef, dict] = {}
        self.created: list[str] = []
        self.objects: list[dict] = []  # every object as submitted, in order
        self.deleted: list[str] = []
        self.pods, self.logs = list(pods), dict(logs or {})
        self.fail_create, self.fail_delete = set(fail_create), set(fail_delete)

    def create(self, obj):
        if obj["kind"] in self.fail_create:
            raise RuntimeError(f"the server has no resource for {obj['kind']}")
        ref = ObjectRef.of(obj)
        self.state[ref] = obj
        self.created.append(obj["kind"])
        self.objects.append(obj)
        return obj

    def get(self, ref):
        return self.state.get(ref)

    def watch(self, ref, timeout_s):
        assert timeout_s > 0
        streams = self.streams.get(ref.kind) or [[]]
        stream = streams.pop(0) if len(streams) > 1 else streams[0]
        for item in stream:
            if callable(item):
                item()
                continue
            if item == "DELETED":
                self.state.pop(ref, None)
                yield WatchEvent("DELETED", {})
                return
            self.state[ref] = {**self.state[ref], **item}
            yield WatchEvent("MODIFIED", self.state[ref])

    def delete(self, ref):
        if ref.kind in self.fail_delete:
            raise RuntimeError("connection reset")
        self.deleted.append(ref.kind)
        self.state.pop(ref, None)

    def list_pods(self, namespace, label_selector):
        assert "ringzero.dev/launch=" in label_selector
        return self.pods

    def log_tail(self, namespace, pod, container, lines):
        return "\n".join(self.logs.get((pod, container), "").splitlines()[-lines:])


def pod(name, phase, containers=("node",)):
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"containers": [{"name": c} for c in containers]}}
