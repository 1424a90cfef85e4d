"""The hardened pod pieces every launched workload shares (TrainJob patches, PyTorchJob, rollout servers).

Each pod meets the Kubernetes "restricted" Pod Security Standard: non-root, no privilege escalation,
every capability dropped, RuntimeDefault seccomp, and a read-only root filesystem with writable
emptyDirs only where the software must write (/tmp, /dev/shm, the model folder).
"""

from __future__ import annotations

from ringzero.config.cluster import ClusterSettings, NodeResources, S3SecretRef

GPU_RESOURCE = "nvidia.com/gpu"
RUN_CONFIG_DIR = "/etc/ringzero/run"
RUN_CONFIG_FILE = "config.yaml"
# The S3 Secret is mounted read-only here; its keys appear under these file names.
S3_CREDENTIAL_VOLUME = "s3-credentials"
S3_CREDENTIAL_DIR = "/etc/ringzero/s3"
S3_ACCESS_KEY_FILE = "access-key"
S3_SECRET_KEY_FILE = "secret-key"
S3_CREDENTIAL_MODE = 0o440  # owner root, group the pod's fsGroup: readable by the run user only


def pod_security(settings: ClusterSettings) -> dict:
    uid = settings.run_user
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(ipc_lock: bool = False) -> dict:
    """The restricted profile's container context. ``ipc_lock`` (``cluster.ipc_lock``) adds back IPC_LOCK
    to the processes that register GPU memory with InfiniBand (NCCL over RDMA pins pages); that one
    capability takes the pod outside the restricted profile, which allows only NET_BIND_SERVICE."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"], **({"add": ["IPC_LOCK"]} if ipc_lock else {})},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def scratch_volumes(resources: NodeResources) -> list[dict]:
    return [
        {"name": "tmp", "emptyDir": {}},
        # NCCL and torch dataloaders exchange tensors through /dev/shm; the runtime default is 64Mi.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": resources.shm}},
    ]


def scratch_mounts() -> list[dict]:
    return [{"name": "tmp", "mountPath": "/tmp"}, {"name": "dshm", "mountPath": "/dev/shm"}]


def run_config_volume(config_map: str) -> dict:
    return {"name": "run-config", "configMap": {"name": config_map}}


def run_config_mount() -> dict:
    return {"name": "run-config", "mountPath": RUN_CONFIG_DIR, "readOnly": True}


def s3_credential_env() -> list[dict]:
    """The store reads the keys from the files these variables name (see ``s3_credential_volume``);
    the values stay in the Secret and never enter the pod spec or the environment."""
    return [
        {"name": "RINGZERO_S3_ACCESS_KEY_FILE", "value": f"{S3_CREDENTIAL_DIR}/{S3_ACCESS_KEY_FILE}"},
        {"name": "RINGZERO_S3_SECRET_KEY_FILE", "value": f"{S3_CREDENTIAL_DIR}/{S3_SECRET_KEY_FILE}"},
    ]


def s3_credential_volume(secret: S3SecretRef) -> dict:
    """The S3 Secret as a volume of just its two keys, readable by the pod's group (the run user's
    fsGroup)."""
    return {
        "name": S3_CREDENTIAL_VOLUME,
        "secret": {
            "secretName": secret.name,
            "defaultMode": S3_CREDENTIAL_MODE,
            "items": [
                {"key": secret.access_key_key, "path": S3_ACCESS_KEY_FILE},
                {"key": secret.secret_key_key, "path": S3_SECRET_KEY_FILE},
            ],
        },
    }


def s3_credential_mount() -> dict:
    return {"name": S3_CREDENTIAL_VOLUME, "mountPath": S3_CREDENTIAL_DIR, "readOnly": True}


def writable_home_env() -> list[dict]:
    # The root filesystem is read-only: point every cache (triton, torch inductor, pip, HF) at /tmp.
    return [{"name": "HOME", "value": "/tmp"}, {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"}]


def resources(node: NodeResources, gpus: int) -> dict:
    requests = {"cpu": node.cpu, "memory": node.memory}
    limits = {"memory": node.memory}
    if gpus:
        requests[GPU_RESOURCE] = str(gpus)
        limits[GPU_RESOURCE] = str(gpus)
    return {"requests": requests, "limits": limits}


def container(
    name: str,
    image: str,
    pull_policy: str,
    command: list[str],
    args: list[str],
    *,
    env: list[dict],
    resources: dict,
    mounts: list[dict],
    ipc_lock: bool = False,
    **extra,
) -> dict:
    """One container with the hardened security context; ``extra`` adds ports and probes."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": list(command),
        "args": list(args),
        "env": list(env),
        "resources": resources,
        "securityContext": container_security(ipc_lock),
        "volumeMounts": list(mounts),
        **extra,
    }


def pod_spec(
    settings: ClusterSettings,
    containers: list[dict],
    *,
    volumes: list[dict],
    init_containers: list[dict] = (),
    restart_policy: str = "Never",
) -> dict:
    spec = {
        "serviceAccountName": settings.service_account,
        # Stage and rollout processes never call the Kubernetes API; only the launcher does.
        "automountServiceAccountToken": False,
        "securityContext": pod_security(settings),
        "restartPolicy": restart_policy,
        "containers": containers,
        "volumes": volumes,
    }
    if init_containers:
        spec["initContainers"] = list(init_containers)
    if settings.node_selector:
        spec["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        spec["tolerations"] = [t.to_k8s() for t in settings.tolerations]
    return spec
