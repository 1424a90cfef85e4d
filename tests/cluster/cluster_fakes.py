"""A scripted fake of the launcher's client boundary, a clock that advances on every reading, and a fake
cluster that runs the training jobs it is given (``RunningCluster``)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ringzero.cluster.api import ObjectRef, WatchEvent

RUNNING = {"status": {"conditions": [{"type": "Created", "status": "True"}]}}
COMPLETE = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
FAILED = {
    "status": {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "PodFailed",
                "message": "node-0 exited with code 1",
            }
        ]
    }
}
READY = {
    "metadata": {"generation": 1},
    "spec": {"replicas": 1},
    "status": {"observedGeneration": 1, "availableReplicas": 1},
}


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

    def __init__(
        self,
        streams: dict[str, list[list]],
        pods=(),
        logs=None,
        fail_create=(),
        fail_delete=(),
        nodes=None,
        events=None,
        crds=None,
    ):
        self.crds = crds  # name -> CRD object; None: the account may not read CRDs
        self.nodes_listed = nodes  # node objects; None: the account may not list nodes
        self.events = dict(events or {})  # pod name -> its events
        self.node_selectors: list[str] = []
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

    def list_events(self, namespace, object_name):
        return list(self.events.get(object_name, []))

    def list_nodes(self, label_selector):
        self.node_selectors.append(label_selector)
        return self.nodes_listed

    def get_crd(self, name):
        from ringzero.cluster.versions import CrdUnreadable

        if self.crds is None:
            raise CrdUnreadable(name)
        return self.crds.get(name)


def node(name, gpus, cpu="112", memory="2000Gi", unschedulable=False, taints=()):
    """A node object as the API returns it: allocatable resources, cordon flag and taints."""
    alloc = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": unschedulable, "taints": list(taints)},
        "status": {"allocatable": alloc},
    }


def pod(name, phase, containers=("node",)):
    return {
        "metadata": {"name": name},
        "status": {"phase": phase},
        "spec": {"containers": [{"name": c} for c in containers]},
    }


# -- a cluster that runs what it is given ------------------------------------------------------------

JOB_KINDS = ("TrainJob", "PyTorchJob")
# The programs the job image provides, as this machine runs them.
PROGRAMS = {"torchrun": [sys.executable, "-m", "torch.distributed.run"], "python": [sys.executable]}
# A reference the kubelet expands in args and env values.
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class ClusterRefused(AssertionError):
    """What a real cluster would refuse or never start, said in its terms."""


@dataclass
class Node:
    """One pod of a training job as the operator would create it: its container and pod spec."""

    name: str
    container: dict
    volumes: list[dict]
    operator_env: dict[str, str]


class RunningCluster(FakeApi):
    """A ``FakeApi`` whose training jobs actually run: each node of a submitted TrainJob or PyTorchJob
    becomes a local process started from the manifest alone (command, args, env, mounted ConfigMaps and
    Secrets, the operator's rank variables), so whatever the job commits was written by the stage code
    the manifest starts. Mount paths are mapped into a per-pod folder (the image's root filesystem is
    read-only and has none of them); ``$(VAR)`` references are expanded as the kubelet expands them.

    ``secrets``: the Secrets in the namespace, ``{name: {key: value}}``. ``host_env``: what the image
    provides besides the manifest (PATH, PYTHONPATH, thread counts).
    """

    def __init__(
        self,
        root: Path,
        secrets: dict[str, dict[str, str]] | None = None,
        host_env: dict[str, str] | None = None,
        timeout_s: float = 300,
    ):
        super().__init__({})
        self.root, self.secrets, self.timeout_s = Path(root), dict(secrets or {}), timeout_s
        self.host_env = dict(host_env or {})
        self.config_maps: dict[str, dict[str, str]] = {}
        self.runs: list[dict] = []  # per node: argv and env as started, rc, output

    def create(self, obj):
        obj = super().create(obj)
        if obj["kind"] == "ConfigMap":
            self.config_maps[obj["metadata"]["name"]] = dict(obj.get("data") or {})
        return obj

    def watch(self, ref, timeout_s):
        assert timeout_s > 0
        if ref.kind not in JOB_KINDS:
            yield from super().watch(ref, timeout_s)
            return
        obj = self.state[ref]
        yield WatchEvent("MODIFIED", obj)
        ok = self.run_job(obj)
        done = {"TrainJob": "Complete", "PyTorchJob": "Succeeded"}[ref.kind]
        cond = (
            {"type": done, "status": "True"}
            if ok
            else {
                "type": "Failed",
                "status": "True",
                "reason": "PodFailed",
                "message": "a node exited non-zero",
            }
        )
        self.state[ref] = {**obj, "status": {"conditions": [cond]}}
        yield WatchEvent("MODIFIED", self.state[ref])

    def list_pods(self, namespace, label_selector):
        return [
            {
                "metadata": {"name": r["pod"]},
                "status": {"phase": "Succeeded" if r["rc"] == 0 else "Failed"},
                "spec": {"containers": [{"name": r["container"]}]},
            }
            for r in self.runs
        ]

    def log_tail(self, namespace, pod, container, lines):
        (run,) = [r for r in self.runs if r["pod"] == pod]
        return "\n".join(run["output"].splitlines()[-lines:])

    # -- the operators ------------------------------------------------------------------------------

    def nodes(self, obj) -> list[Node]:
        name = obj["metadata"]["name"]
        if obj["kind"] == "TrainJob":
            return self._trainjob_nodes(name, obj["spec"])
        return self._pytorchjob_nodes(name, obj["spec"])

    def _trainjob_nodes(self, name, spec) -> list[Node]:
        trainer = spec["trainer"]
        (patch,) = [p for p in spec.get("runtimePatches", [])]
        (replicated,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        if replicated["name"] != "node":
            raise ClusterRefused(
                f"the torch-distributed runtime has no replicated job {replicated['name']!r}"
            )
        pod_spec = replicated["template"]["spec"]["template"]["spec"]
        (patched,) = pod_spec["containers"]
        if patched["name"] != "node":
            raise ClusterRefused(f"the runtime's container is 'node', the patch names {patched['name']!r}")
        container = {
            **patched,
            **{k: trainer[k] for k in ("image", "command", "args", "env") if k in trainer},
        }
        nodes, procs = int(trainer["numNodes"]), int(trainer["numProcPerNode"])
        gpus = int((trainer.get("resourcesPerNode") or {}).get("requests", {}).get("nvidia.com/gpu", 0))
        if gpus and gpus != procs:
            raise ClusterRefused(f"numProcPerNode {procs} with {gpus} GPUs per node")
        port = str(_free_port())
        return [
            Node(
                f"{name}-node-0-{i}",
                container,
                pod_spec.get("volumes", []),
                {
                    "PET_NNODES": str(nodes),
                    "PET_NPROC_PER_NODE": str(procs),
                    "PET_NODE_RANK": str(i),
                    "PET_MASTER_ADDR": "127.0.0.1",
                    "PET_MASTER_PORT": port,
                },
            )
            for i in range(nodes)
        ]

    def _pytorchjob_nodes(self, name, spec) -> list[Node]:
        replicas = spec["pytorchReplicaSpecs"]
        procs = int(spec["nprocPerNode"])
        pods = [("master", 0, replicas["Master"])]
        pods += [
            ("worker", i, replicas["Worker"])
            for i in range(int(replicas.get("Worker", {}).get("replicas", 0)))
        ]
        nodes, port = len(pods), None
        out = []
        for rank, (role, index, replica) in enumerate(pods):
            pod_spec = replica["template"]["spec"]
            (container,) = [c for c in pod_spec["containers"] if c["name"] == "pytorch"]
            declared = [p for p in container.get("ports", []) if p.get("name") == "pytorchjob-port"]
            port = port or str(_free_port())
            if not declared:
                raise ClusterRefused("the PyTorchJob container declares no 'pytorchjob-port' port")
            out.append(
                Node(
                    f"{name}-{role}-{index}",
                    container,
                    pod_spec.get("volumes", []),
                    {
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port,
                        "WORLD_SIZE": str(nodes),
                        "RANK": str(rank),
                        "PET_NNODES": str(nodes),
                        "PET_NODE_RANK": str(rank),
                        "PET_NPROC_PER_NODE": str(procs),
                    },
                )
            )
        return out

    # -- the kubelet --------------------------------------------------------------------------------

    def run_job(self, obj) -> bool:
        procs = [self._start(node) for node in self.nodes(obj)]
        ok = True
        for run, proc in procs:
            try:
                run["output"], _ = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                run["output"], _ = proc.communicate()
            run["rc"] = proc.returncode
            ok &= proc.returncode == 0
        return ok

    def _start(self, node: Node):
        pod_root = self.root / node.name
        mounts = self._mount(node, pod_root)
        env = dict(node.operator_env)
        for item in node.container.get("env", []):
            env[item["name"]] = self._env_value(item, env)
        env = {k: _rewrite(_expand(v, env), mounts) for k, v in env.items()}
        command = node.container.get("command") or []
        if not command or command[0] not in PROGRAMS:
            raise ClusterRefused(f"container command {command!r}: the image provides {sorted(PROGRAMS)}")
        args = [_rewrite(_expand(a, env), mounts) for a in [*command[1:], *node.container.get("args", [])]]
        argv = [*PROGRAMS[command[0]], *args]
        full_env = {**self.host_env, **env}
        proc = subprocess.Popen(
            argv, env=full_env, cwd=pod_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        run = {
            "pod": node.name,
            "container": node.container["name"],
            "argv": argv,
            "env": env,
            "mounts": mounts,
            "rc": None,
            "output": "",
        }
        self.runs.append(run)
        return run, proc

    def _mount(self, node: Node, pod_root: Path) -> dict[str, Path]:
        """Each volumeMount's path -> a folder holding what the volume would show there."""
        volumes = {v["name"]: v for v in node.volumes}
        mounts: dict[str, Path] = {}
        for mount in node.container.get("volumeMounts", []):
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ClusterRefused(f"volumeMount {mount['name']!r} names no volume of the pod")
            path = pod_root / mount["mountPath"].lstrip("/")
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                name = volume["configMap"]["name"]
                if name not in self.config_maps:
                    raise ClusterRefused(f"pod stays ContainerCreating: ConfigMap {name!r} not found")
                files = self.config_maps[name]
                items = volume["configMap"].get("items")
            elif "secret" in volume:
                name = volume["secret"]["secretName"]
                if name not in self.secrets:
                    raise ClusterRefused(f"pod stays ContainerCreating: Secret {name!r} not found")
                files = self.secrets[name]
                items = volume["secret"].get("items")
            elif "emptyDir" in volume:
                files, items = {}, None
            else:
                raise ClusterRefused(
                    f"volume {volume['name']!r}: this fake knows configMap, secret and emptyDir"
                )
            for item in items or [{"key": k, "path": k} for k in files]:
                if item["key"] not in files:
                    raise ClusterRefused(
                        f"volume {volume['name']!r} projects key {item['key']!r}, which is missing"
                    )
                target = path / item["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(files[item["key"]])
            mounts[mount["mountPath"].rstrip("/")] = path
        return mounts

    def _env_value(self, item: dict, env: dict[str, str]) -> str:
        if "value" in item:
            return str(item["value"])
        source = item.get("valueFrom") or {}
        if ref := source.get("secretKeyRef"):
            secret = self.secrets.get(ref["name"])
            if secret is None or ref["key"] not in secret:
                raise ClusterRefused(f"env {item['name']}: Secret {ref['name']!r} has no key {ref['key']!r}")
            return secret[ref["key"]]
        if ref := source.get("configMapKeyRef"):
            data = self.config_maps.get(ref["name"], {})
            if ref["key"] not in data:
                raise ClusterRefused(
                    f"env {item['name']}: ConfigMap {ref['name']!r} has no key {ref['key']!r}"
                )
            return data[ref["key"]]
        if ref := source.get("fieldRef"):
            return {"metadata.name": "pod", "metadata.namespace": "ns"}.get(ref["fieldPath"], "")
        raise ClusterRefused(f"env {item['name']}: neither a value nor a source this fake knows")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: defined variables replaced, unknown ones left as written."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _rewrite(text: str, mounts: dict[str, Path]) -> str:
    """Absolute paths under a mount point, moved to where this fake put that mount."""
    if not mounts:
        return text
    points = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))  # one pass, longest first
    return re.sub(rf"(?<![\w/.])({points})(?=/|$|:)", lambda m: str(mounts[m.group(1)]), text)
