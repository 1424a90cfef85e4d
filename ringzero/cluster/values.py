"""The launcher's settings from Helm values files, without Helm: what the chart's cluster ConfigMap holds.

``helm/ringzero/templates/configmap-cluster.yaml`` turns the chart's values into ``ClusterSettings``
(snake_case) for the pipeline steps. ``cluster plan`` needs the same settings before anything is installed,
so this module merges values files over the chart's own ``values.yaml`` as Helm does (maps merge key by
key, anything else is replaced) and maps them the way the template does. A test renders every shipped
values file with ``helm template`` and compares, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

from ringzero.config.cluster import ClusterSettings
from ringzero.errors import ConfigError

CHART = Path(__file__).resolve().parents[2] / "helm" / "ringzero"
CHART_NAME = "ringzero"


def merge(base: dict, override: dict) -> dict:
    """Helm's values merge: maps key by key, lists and scalars replaced; a null removes the key."""
    out = dict(base)
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_values(files: Iterable[str | Path], chart: Path = CHART) -> dict:
    """The chart's values.yaml with each file merged over it, in order."""
    values = _read(chart / "values.yaml")
    for path in files:
        values = merge(values, _read(Path(path)))
    return values


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(str(path), ["no such values file"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not YAML: {exc}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), ["a values file is a mapping at the top level"])
    return data


def fullname(values: dict, release: str) -> str:
    """The chart's ``ringzero.fullname``: the release name, prefixed to the chart's unless it contains it."""
    if values.get("fullnameOverride"):
        return values["fullnameOverride"][:40].rstrip("-")
    name = (values.get("nameOverride") or CHART_NAME)[:40].rstrip("-")
    full = release if name in release else f"{release}-{name}"
    return full[:40].rstrip("-")


def service_account(values: dict, release: str) -> str:
    account = values.get("serviceAccount", {})
    if account.get("create", True):
        return account.get("name") or fullname(values, release)
    if not account.get("name"):
        raise ConfigError(
            "values",
            [
                "serviceAccount.name: give the existing service account to use when "
                "serviceAccount.create is false"
            ],
        )
    return account["name"]


def settings_dict(values: dict, release: str = "ringzero", namespace: str = "default") -> dict:
    """The chart's ``cluster.yaml`` for these values, as a plain mapping."""
    c, images, s3 = values["cluster"], values["images"], values["s3"]
    r = c["rollout"]
    rollout = {
        "replicas": r["replicas"],
        "tp_size": r["tpSize"],
        "resources": r["resources"],
        "ready_timeout_s": r["readyTimeoutSeconds"],
        "weight_sync": r["weightSync"],
        "shared_weights_mount": r["sharedWeightsMount"],
    }
    if r.get("sharedWeightsPvc"):
        rollout["shared_weights_pvc"] = r["sharedWeightsPvc"]
    out = {
        "namespace": namespace,
        "backend": c["backend"],
        "runtime": c["runtime"],
        "images": {
            kind: {
                "repository": images[kind]["repository"],
                "tag": images[kind].get("digest") or images[kind]["tag"],
                "pull_policy": images["pullPolicy"],
            }
            for kind in ("trainer", "rollout", "cpu")
        },
        "device": c["device"],
        "num_nodes": c["numNodes"],
        "gpus_per_node": c["gpusPerNode"],
        "node_resources": c["nodeResources"],
        "node_selector": c["nodeSelector"],
        "tolerations": c["tolerations"],
        "service_account": service_account(values, release),
        "s3_secret": {
            "name": s3["existingSecret"],
            "access_key_key": s3["accessKeyKey"],
            "secret_key_key": s3["secretKeyKey"],
        },
        "run_user": values["runAsUser"],
        "rollout": rollout,
        "job_timeout_s": c["jobTimeoutSeconds"],
        "pending_timeout_s": c["pendingTimeoutSeconds"],
        "image_pull_timeout_s": c["imagePullTimeoutSeconds"],
        "crash_loop_restarts": c["crashLoopRestarts"],
        "log_lines": c["logLines"],
        "ipc_lock": c["ipcLock"],
    }
    return out


def pipeline_overrides(values: dict) -> list[str]:
    """The run-config overrides the chart's pipeline upload passes (``pipeline.overrides``)."""
    return list(values.get("pipeline", {}).get("overrides") or [])


def settings_from_values(
    files: Iterable[str | Path],
    release: str = "ringzero",
    namespace: str = "default",
    chart: Path = CHART,
    values: dict | None = None,
) -> ClusterSettings:
    files = list(files)
    data = settings_dict(load_values(files, chart) if values is None else values, release, namespace)
    try:
        return ClusterSettings.model_validate(data)
    except ValidationError as exc:
        where = ", ".join(map(str, files)) or str(chart / "values.yaml")
        problems = [f"cluster.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError(where, problems) from None
