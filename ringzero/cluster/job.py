"""What one launch runs: the stage command, its resolved run config, and the ConfigMap that carries it.

Every node of a stage job runs one ``torchrun`` agent, which starts ``gpus_per_node`` (one on CPU nodes)
copies of ``ringzero stage run``; the agents of all nodes meet at a c10d rendezvous, so the stage runs
as one process group of ``num_nodes x procs_per_node`` ranks. That world must be the run config's
``parallel.dp x parallel.cp``: ``torchrun_args`` refuses any other. Each backend supplies the
rendezvous endpoint from the variables its operator sets on the pods (see ``trainjob``, ``pytorchjob``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ringzero.cluster.labels import OwnerRef, launch_labels, metadata
from ringzero.cluster.pods import RUN_CONFIG_DIR, RUN_CONFIG_FILE
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError
from ringzero.parallel.config import world_product

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
    # the run config's parallel.dp, parallel.cp, engines.training.tp and pp: the world is their product
    dp: int
    cp: int
    stage_args: tuple[str, ...] = ()  # appended to `ringzero stage run CONFIG --stage NAME` (--init URI, ...)
    env: dict[str, str] = field(default_factory=dict)  # plain, non-secret settings
    owner: OwnerRef | None = None
    tp: int = 1
    pp: int = 1

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

    def stage_command(self, extra: tuple[str, ...] = ()) -> list[str]:
        """``ringzero stage run`` as each rank runs it (after torchrun's ``-m``)."""
        config = f"{RUN_CONFIG_DIR}/{RUN_CONFIG_FILE}"
        return ["ringzero.cli.main", "stage", "run", config, "--stage", self.stage, *self.stage_args, *extra]

    def plain_env(self) -> list[dict]:
        base = {"RINGZERO_RUN": self.run, "RINGZERO_STAGE": self.stage, "RINGZERO_LAUNCH": self.name}
        return [{"name": k, "value": v} for k, v in {**base, **self.env}.items()]


TORCHRUN = ["torchrun"]  # torch's launcher, installed next to ``ringzero`` in every job image


def check_world(settings: ClusterSettings, job: StageJob) -> None:
    """The job's ranks (nodes x processes per node) must be the run's dp x cp x tp x pp, or the stage cannot
    start."""
    nodes, procs = settings.num_nodes, settings.procs_per_node()
    names, values, ranks = world_product(job.dp, job.cp, job.tp, job.pp)
    if nodes * procs != ranks:
        per_node = _count(procs, "GPU") + " per node" if settings.gpus_per_node else "1 process per CPU node"
        raise RingzeroError(
            f"stage {job.stage!r} of run {job.run!r}: the cluster settings run {_count(nodes, 'node')} x "
            f"{per_node} = {_count(nodes * procs, 'rank')}, but the run config's {names} = {values} = "
            f"{ranks}; "
            f"make cluster num_nodes x gpus_per_node equal that product"
        )


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def torchrun_args(
    settings: ClusterSettings, job: StageJob, endpoint: str, extra: tuple[str, ...] = ()
) -> list[str]:
    """torchrun's arguments on every node: the node and process counts, the rendezvous, then the stage.

    ``endpoint`` is HOST:PORT of the first node, usually ``$(VAR)`` references that the kubelet expands
    from the pod's environment. The rendezvous id is the launch name, unique per launch, so a rerun
    never joins the agents of an earlier one. No in-place restarts: a failed stage is resumed by the
    pipeline from its last checkpoint.
    """
    check_world(settings, job)
    return [
        f"--nnodes={settings.num_nodes}",
        f"--nproc-per-node={settings.procs_per_node()}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={job.name}",
        "--max-restarts=0",
        "-m",
        *job.stage_command(extra),
    ]


def stage_args(inputs) -> tuple[str, ...]:
    """A stage's input URIs as ``ringzero stage run`` flags (``StageInputs`` -> --init/--reference/...)."""
    args: list[str] = []
    for flag, uri in (
        ("--init", inputs.init_uri),
        ("--reference", inputs.reference_uri),
        ("--base", inputs.base_uri),
    ):
        if uri:
            args += [flag, uri]
    for name, uri in sorted(inputs.compare.items()):
        args += ["--compare", f"{name}={uri}"]
    return tuple(args)


def render_config_map(job: StageJob) -> dict:
    """The resolved run config, mounted read-only into the job and rollout pods of this launch."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(job.config_map_name(), job.namespace, job.labels("run-config"), job.owner),
        "data": {RUN_CONFIG_FILE: job.config_yaml},
    }
