"""What one launch runs: the stage command, its resolved run config, and the ConfigMap that carries it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ringzero.cluster.labels import OwnerRef, launch_labels, metadata
from ringzero.cluster.pods import RUN_CONFIG_DIR, RUN_CONFIG_FILE
from ringzero.errors import RingzeroError

# Environment names that look like credentials must come from a Secret, never as plain values.
_SECRET_LOOKING = re.compile(r"(SECRET|PASSWORD|TOKEN|CREDENTIAL|ACCESS_KEY|PRIVATE)", re.IGNORECASE)


@dataclass(frozen=True)
class StageJob:
    """One stage of one run, as launched on the cluster."""

    run: str
    stage: str
    name: str  # from labels.launch_name: unique per launch, a DNS label
    namespace: str
    config_yaml: str  # the fully resolved run config the stage reads
    stage_args: tuple[str, ...] = ()  # appended to `ringzero stage run CONFIG --stage NAME` (--init URI, ...)
    env: dict[str, str] = field(default_factory=dict)  # plain, non-secret settings
    owner: OwnerRef | None = None

    def __post_init__(self):
        # A *_FILE variable names a mounted secret's path, which is fine to pass in plain.
        leaked = sorted(k for k in self.env if _SECRET_LOOKING.search(k) and not k.endswith("_FILE"))
        if leaked:
            raise RingzeroError(
                f"env {leaked} look like credentials: they must come from the S3 Secret, not plain values"
            )

    def labels(self, component: str) -> dict[str, str]:
        return launch_labels(self.run, self.stage, self.name, component)

    def config_map_name(self) -> str:
        return f"{self.name}-config"

    def rollout_name(self) -> str:
        return f"{self.name}-rollout"

    def command(self) -> list[str]:
        return ["ringzero", "stage"]

    def args(self, extra: tuple[str, ...] = ()) -> list[str]:
        config = f"{RUN_CONFIG_DIR}/{RUN_CONFIG_FILE}"
        return ["run", config, "--stage", self.stage, *self.stage_args, *extra]

    def plain_env(self) -> list[dict]:
        base = {"RINGZERO_RUN": self.run, "RINGZERO_STAGE": self.stage, "RINGZERO_LAUNCH": self.name}
        return [{"name": k, "value": v} for k, v in {**base, **self.env}.items()]


def render_config_map(job: StageJob) -> dict:
    """The resolved run config, mounted read-only into the job and rollout pods of this launch."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job.config_map_name(), job.namespace, job.labels("run-config"), job.owner),
        "data": {RUN_CONFIG_FILE: job.config_yaml},
    }
