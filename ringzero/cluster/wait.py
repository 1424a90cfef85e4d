"""Wait for launched objects with watches and a deadline, and explain failures with the pods' last log
lines."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ringzero.cluster.api import ClusterApi, ObjectRef
from ringzero.errors import RingzeroError


class StageFailed(RingzeroError):
    """A stage's job or rollout servers failed; the message carries the reason and the pods' last log
    lines."""


class StageTimeout(StageFailed):
    """A stage did not finish (or its servers did not become ready) within its timeout."""


@dataclass(frozen=True)
class Verdict:
    state: Literal["running", "succeeded", "failed"]
    reason: str = ""


RUNNING = Verdict("running")


def _true_condition(obj: dict, types: tuple[str, ...]) -> dict | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") in types and cond.get("status") == "True":
            return cond
    return None


def _describe(cond: dict) -> str:
    return ": ".join(p for p in (cond.get("reason"), cond.get("message")) if p) or cond["type"]


def trainjob_verdict(obj: dict) -> Verdict:
    if cond := _true_condition(obj, ("Failed",)):
        return Verdict("failed", _describe(cond))
    if _true_condition(obj, ("Complete",)):
        return Verdict("succeeded")
    return RUNNING


def pytorchjob_verdict(obj: dict) -> Verdict:
    if cond := _true_condition(obj, ("Failed",)):
        return Verdict("failed", _describe(cond))
    if _true_condition(obj, ("Succeeded",)):
        return Verdict("succeeded")
    return RUNNING


def deployment_verdict(obj: dict) -> Verdict:
    """Ready when every wanted replica of the current generation is available."""
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return Verdict("failed", _describe(cond))
    wanted = (obj.get("spec") or {}).get("replicas", 1)
    current = status.get("observedGeneration", 0) >= (obj.get("metadata") or {}).get("generation", 0)
    if current and status.get("availableReplicas", 0) >= wanted:
        return Verdict("succeeded")
    return RUNNING


POLL_S = 15.0
"""How often a wait wakes up to look at the launch's pods (``stuck``) while nothing changes."""


def wait_for(
    api: ClusterApi,
    ref: ObjectRef,
    verdict: Callable[[dict], Verdict],
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    stuck: Callable[[], str | None] | None = None,
    poll_s: float = POLL_S,
) -> dict:
    """Block until ``verdict`` says succeeded (returns the object) or failed / timed out (raises). With
    ``stuck``, also fail as soon as it names a reason (pods that will never run: ``stuck.StuckPods``)."""
    deadline = clock() + timeout_s
    obj = api.get(ref)
    while True:
        if obj is None:
            raise StageFailed(f"{ref} was deleted while the launcher waited for it")
        v = verdict(obj)
        if v.state == "succeeded":
            return obj
        if v.state == "failed":
            raise StageFailed(f"{ref} failed: {v.reason}")
        if stuck is not None and (reason := stuck()):
            raise StageFailed(f"{ref} cannot run: {reason}")
        remaining = deadline - clock()
        if remaining <= 0:
            raise StageTimeout(f"{ref} did not finish within {timeout_s:.0f} s")
        # With pods to look at, the watch's own server-side timeout wakes the wait up when nothing changes.
        obj = _next_change(
            api, ref, remaining if stuck is None else min(remaining, poll_s), verdict, deadline, clock
        )


def _next_change(api, ref, watch_s, verdict, deadline, clock) -> dict | None:
    """Watch until a decisive change or the deadline; then (or when the stream ends) return the latest
    state."""
    latest = None
    for event in api.watch(ref, timeout_s=watch_s):
        if event.type == "DELETED":
            return None
        latest = event.object
        if verdict(latest).state != "running" or clock() >= deadline:
            return latest
    # The stream ended (server-side timeout, e.g. the poll interval, or a dropped connection): read afresh.
    return api.get(ref)


def failure_logs(api: ClusterApi, namespace: str, label_selector: str, lines: int, max_pods: int = 3) -> str:
    """The last log lines of the launch's pods, failed pods first, so the error says what went wrong."""
    try:
        found = api.list_pods(namespace, label_selector)
    except Exception as exc:  # the report must not hide the original failure
        return f"(could not list pods: {exc})"
    if not found:
        return "(no pods were created: check events, quotas, node selectors and the training runtime)"

    def failed_first(pod: dict) -> tuple:
        return ((pod.get("status") or {}).get("phase") != "Failed", pod["metadata"]["name"])

    parts = []
    for pod in sorted(found, key=failed_first)[:max_pods]:
        name = pod["metadata"]["name"]
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        containers = [c["name"] for c in (pod.get("spec") or {}).get("initContainers", [])]
        containers += [c["name"] for c in (pod.get("spec") or {}).get("containers", [])]
        for container in containers:
            try:
                text = api.log_tail(namespace, name, container, lines)
            except Exception as exc:
                text = f"(no log: {exc})"
            if text.strip():
                parts.append(
                    f"--- pod {name} ({phase}), container {container}, last {lines} lines ---\n"
                    f"{text.rstrip()}"
                )
    return "\n".join(parts) or "(the pods wrote no log lines)"
