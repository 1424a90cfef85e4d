"""``launch_stage``: run one stage on the cluster and always clean up after it.

Order: the run-config ConfigMap, then (for stages that sample) the SGLang servers and their Services,
waited on until healthy, then the training job, waited on until it ends. The job's run config is
pointed at those servers with ``--set`` flags (``rollout_overrides``): the Service, the headless
Service whose A records are the replicas, their count and TP size, the weight transport and the
checkpoint they serve; for disk weight sync the shared weights volume is mounted in the job's pods. Whatever
happens (success, failure, timeout, Ctrl-C, SIGTERM from a cancelled pipeline step) everything created is
deleted on the way out; the owner reference to the pipeline step's pod is the second line of defence if the
launcher itself is killed.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable

from ringzero.cluster.api import ClusterApi, ObjectRef
from ringzero.cluster.capacity import check_capacity
from ringzero.cluster.job import StageJob, render_config_map
from ringzero.cluster.labels import LAUNCH_LABEL, selector
from ringzero.cluster.pytorchjob import render_pytorchjob
from ringzero.cluster.rollout import (
    RolloutSpec,
    endpoint,
    render_rollout,
    replica_dns,
    weights_dir,
    with_shared_weights,
)
from ringzero.cluster.stuck import StuckPods
from ringzero.cluster.trainjob import render_trainjob
from ringzero.cluster.versions import check_job_crd
from ringzero.cluster.wait import (
    StageFailed,
    deployment_verdict,
    failure_logs,
    pytorchjob_verdict,
    trainjob_verdict,
    wait_for,
)
from ringzero.config.cluster import ClusterSettings
from ringzero.errors import RingzeroError

log = logging.getLogger(__name__)

BACKENDS = {
    "trainjob": (render_trainjob, trainjob_verdict),
    "pytorchjob": (render_pytorchjob, pytorchjob_verdict),
}


def render_stage(settings: ClusterSettings, job: StageJob, rollout: RolloutSpec | None = None) -> list[dict]:
    """Every object a launch creates, in creation order (pure: what ``launch_stage`` submits)."""
    if rollout is not None and settings.device == "cpu":
        raise RingzeroError(
            "SGLang rollout servers need GPUs: with device cpu use the embedded rollout engine"
        )
    render_job, _ = BACKENDS[settings.backend]
    objects = [render_config_map(job)]
    extra: tuple[str, ...] = ()
    if rollout is not None:
        objects += render_rollout(settings, job, rollout)
        extra = rollout_overrides(settings, job, rollout)
    training = render_job(settings, job, extra)
    objects.append(with_shared_weights(settings, training) if rollout is not None else training)
    return objects


def rollout_overrides(settings: ClusterSettings, job: StageJob, rollout: RolloutSpec) -> tuple[str, ...]:
    """``--set`` flags that point the stage's rollout client at this launch's servers, every replica by
    address."""
    values = {
        "kind": "sglang",
        "endpoint": endpoint(job),
        "replica_dns": replica_dns(job),
        "replicas": settings.rollout.replicas,
        "tp_size": settings.rollout.tp_size,
        "weight_sync": settings.rollout.weight_sync,
        "served_uri": rollout.model_uri,
    }
    if settings.rollout.weight_sync == "disk":
        values["weights_dir"] = weights_dir(settings, job)
    out: list[str] = []
    for key, value in values.items():
        out += ["--set", f"engines.rollout.{key}={value}"]
    return tuple(out)


def launch_stage(
    api: ClusterApi,
    settings: ClusterSettings,
    job: StageJob,
    rollout: RolloutSpec | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Run the stage; returns the finished job object. Raises ``StageFailed``/``StageTimeout`` with log
    tails."""
    objects = render_stage(settings, job, rollout)
    check_job_crd(api, settings.backend)
    check_capacity(api, settings, objects, job.stage)
    *support, training = objects
    _, job_verdict = BACKENDS[settings.backend]
    created: list[ObjectRef] = []
    with _terminate_raises_interrupt():
        try:
            for obj in support:
                _create(api, created, obj)
            if rollout is not None:
                deployment = next(o for o in support if o["kind"] == "Deployment")
                _wait(
                    api,
                    settings,
                    job,
                    deployment,
                    deployment_verdict,
                    settings.rollout.ready_timeout_s,
                    clock,
                )
            _create(api, created, training)
            return _wait(api, settings, job, training, job_verdict, settings.job_timeout_s, clock)
        finally:
            with _signals_ignored():
                cleanup(api, created)


def _create(api: ClusterApi, created: list[ObjectRef], obj: dict) -> None:
    ref = ObjectRef.of(obj)
    # Recorded before the call: a create that times out on our side may still have happened on the server.
    created.append(ref)
    api.create(obj)
    log.info("created %s", ref)


def _wait(api, settings, job, obj, verdict, timeout_s, clock) -> dict:
    ref = ObjectRef.of(obj)
    component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
    pods = selector({LAUNCH_LABEL: job.name, "app.kubernetes.io/component": component})
    stuck = StuckPods(api, settings, job.namespace, pods, clock)
    try:
        return wait_for(api, ref, verdict, timeout_s, clock, stuck=stuck.check)
    except StageFailed as exc:
        logs = failure_logs(api, job.namespace, pods, settings.log_lines)
        raise type(exc)(f"stage {job.stage!r} of run {job.run!r}: {exc}\n{logs}") from exc


def cleanup(api: ClusterApi, created: list[ObjectRef]) -> None:
    """Delete in reverse creation order; one failed delete does not stop the others."""
    for ref in reversed(created):
        try:
            api.delete(ref)
            log.info("deleted %s", ref)
        except Exception as exc:  # the owner reference still collects it when the step's pod goes
            log.warning("could not delete %s: %s", ref, exc)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _terminate_raises_interrupt():
    """SIGTERM (a cancelled pipeline step, a deleted pod) unwinds like Ctrl-C, so ``finally`` cleans up."""
    if not _in_main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_ignored():
    """A second Ctrl-C or SIGTERM must not cut the cleanup short."""
    if not _in_main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
