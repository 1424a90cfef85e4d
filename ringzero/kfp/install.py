"""What a run of an installed release needs besides its run config, read from the release itself.

The chart writes it into its cluster ConfigMap (``<release>-ringzero-cluster``): the launcher's settings
(``cluster.yaml``), the store (``s3-*``), the step image, the service account runs use, the pipeline's
run config and overrides. Two readers turn it into the same ``--set`` overrides of a run config:

- the chart's pipeline upload Job, with the ConfigMap mounted (``ringzero kfp compile --install DIR``);
- a shell, from the cluster's API (``ringzero kfp submit --release NAME``), which then also takes the run
  config by name from the release's run-config ConfigMap when no such local file exists.

So a run submitted from a shell is the run the chart's uploaded pipeline starts from the UI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from ringzero.errors import RingzeroError

SETTINGS_COMPONENT = "cluster-settings"
RUNS_COMPONENT = "run-configs"
KEYS = (
    "cluster.yaml",
    "s3-endpoint",
    "s3-secure",
    "s3-root",
    "s3-region",
    "s3-secret.yaml",
    "step-image",
    "service-account",
    "kfp-host",
    "run-config",
    "pipeline-overrides.yaml",
)


@dataclass(frozen=True)
class Install:
    """One release's settings for runs (the chart's cluster ConfigMap), and its run configs."""

    data: dict[str, str]
    where: str  # for messages: the folder or the ConfigMap it came from
    run_configs: dict[str, str] | None = None  # file name -> YAML text (from the cluster only)

    def __post_init__(self):
        missing = [k for k in KEYS if k not in self.data]
        if missing:
            raise RingzeroError(
                f"{self.where}: no {', '.join(missing)}; is it the cluster ConfigMap of a ringzero release "
                "of this "
                "version? (helm upgrade the release to write them)"
            )

    @property
    def service_account(self) -> str:
        return self.data["service-account"]

    @property
    def kfp_host(self) -> str:
        return self.data["kfp-host"]

    @property
    def run_config(self) -> str:
        return self.data["run-config"]

    def overrides(self, run_config_name: str) -> list[str]:
        """The run config's ``--set`` overrides for a pipeline of this release (what the upload Job
        passes)."""
        d = self.data
        out = [
            f"storage.root={d['s3-root']}/{Path(run_config_name).stem}",
            f"storage.s3.endpoint={d['s3-endpoint']}",
            f"storage.s3.secure={d['s3-secure']}",
        ]
        if d["s3-region"]:
            out.append(f"storage.s3.region={d['s3-region']}")
        secret = yaml.safe_load(d["s3-secret.yaml"])
        out += [
            "kfp.mode=cluster",
            f"kfp.base_image={d['step-image']}",
            f"kfp.s3_secret={yaml.safe_dump(secret, default_flow_style=True).strip()}",
            f"kfp.service_account={d['service-account']}",
            f"cluster={d['cluster.yaml']}",
        ]
        return out + list(yaml.safe_load(d["pipeline-overrides.yaml"]) or [])

    def config_path(self, name: str, scratch: Path) -> Path:
        """A local run config file, or the release's run config of that name written to ``scratch``."""
        if Path(name).is_file():
            return Path(name)
        if self.run_configs is None or name not in self.run_configs:
            known = ", ".join(sorted(self.run_configs or {})) or "none"
            raise RingzeroError(f"{name}: no such file here, nor a run config of the release ({known})")
        path = scratch / name
        path.write_text(self.run_configs[name])
        return path


def from_dir(folder: str | Path) -> Install:
    """The ConfigMap as mounted in a pod: one file per key."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RingzeroError(f"{folder}: no such folder (the release's cluster ConfigMap is mounted there)")
    return Install(
        {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")},
        str(folder),
    )


def from_release(release: str, namespace: str | None = None, api=None) -> Install:
    """The release's ConfigMaps through the cluster's API (the kubeconfig's current context)."""
    if api is None:
        from ringzero.cluster.kube import KubernetesApi

        api = KubernetesApi()
    namespace = namespace or _context_namespace()

    def one(component: str) -> dict:
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}"
        found = api.list_config_maps(namespace, selector)
        if len(found) != 1:
            raise RingzeroError(
                f"release {release!r} in namespace {namespace!r}: {'no' if not found else len(found)} "
                "ConfigMaps "
                f"labelled {selector}; is the release installed there (helm list -n {namespace})?"
            )
        return found[0]

    settings, runs = one(SETTINGS_COMPONENT), one(RUNS_COMPONENT)
    return Install(
        dict(settings.get("data") or {}),
        f"ConfigMap {namespace}/{settings['metadata']['name']}",
        dict(runs.get("data") or {}),
    )


def _context_namespace() -> str:
    try:
        from kubernetes import config

        _, context = config.list_kube_config_contexts()
        return (context or {}).get("context", {}).get("namespace") or "default"
    except Exception:  # no kubeconfig: in-cluster, or the API call will say what is wrong
        from ringzero.cluster.kube import current_namespace

        return current_namespace()
