"""Pods that will not get anywhere: found while the launcher waits, so a step fails in minutes, not days.

A job or Deployment whose pods cannot be scheduled, cannot pull their image or crash on start never
reports failure by itself: the TrainJob stays "Created", the Deployment "Progressing", until a deadline
days away. ``StuckPods`` looks at the launch's pods each time the launcher wakes up and names the first
one that is stuck:

- **unschedulable**: the ``PodScheduled`` condition is False with reason ``Unschedulable`` (the
  scheduler's message says what no node has: GPUs, memory, a label, a toleration) for
  ``pending_timeout_s`` since the launcher first saw it so;
- **image**: a container waits with ``InvalidImageName`` or ``ErrImageNeverPull`` (at once), or with
  ``ErrImagePull`` / ``ImagePullBackOff`` for ``image_pull_timeout_s``;
- **config**: a container waits with ``CreateContainerConfigError`` (a missing Secret or ConfigMap key)
  for ``image_pull_timeout_s``;
- **crash loop**: a container waits in ``CrashLoopBackOff`` after ``crash_loop_restarts`` restarts.

Durations are the launcher's own clock from when it first saw the condition, not the cluster's
timestamps, so a skewed node clock cannot fail a stage early. The message ends with the pod's last
events (the scheduler's and the kubelet's own words).
"""

from __future__ import annotations

from collections.abc import Callable

from ringzero.cluster.api import ClusterApi
from ringzero.config.cluster import ClusterSettings

NEVER_PULLS = ("InvalidImageName", "ErrImageNeverPull")
PULL_WAITS = ("ErrImagePull", "ImagePullBackOff")
CONFIG_WAITS = ("CreateContainerConfigError",)
EVENTS_SHOWN = 5


class StuckPods:
    def __init__(
        self,
        api: ClusterApi,
        settings: ClusterSettings,
        namespace: str,
        label_selector: str,
        clock: Callable[[], float],
    ):
        self.api, self.settings, self.namespace, self.selector, self.clock = (
            api,
            settings,
            namespace,
            label_selector,
            clock,
        )
        self._since: dict[tuple[str, str], float] = {}  # (pod, what) -> when first seen

    def check(self) -> str | None:
        """Why the launch cannot go on, or None while its pods may still get somewhere."""
        try:
            pods = self.api.list_pods(self.namespace, self.selector)
        except Exception:  # a failed look is no verdict: the next wake-up looks again
            return None
        seen = set()
        for pod in pods:
            name = pod["metadata"]["name"]
            for what, limit, reason in self._conditions(pod):
                seen.add((name, what))
                first = self._since.setdefault((name, what), self.clock())
                if self.clock() - first >= limit:
                    return f"pod {name} {reason}{self._events(name)}"
        self._since = {k: v for k, v in self._since.items() if k in seen}  # a condition that cleared restarts
        return None

    def _conditions(self, pod: dict):
        """``(what, seconds it may last, description)`` of each stuck condition the pod is in now."""
        s = self.settings
        status = pod.get("status") or {}
        for cond in status.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                yield (
                    "unschedulable",
                    s.pending_timeout_s,
                    f"cannot be scheduled ({cond.get('message') or 'no reason given'}), for "
                    f"{s.pending_timeout_s:g} s (cluster.pendingTimeoutSeconds)",
                )
        statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        for c in statuses:
            waiting = (c.get("state") or {}).get("waiting") or {}
            why, detail = waiting.get("reason"), waiting.get("message") or ""
            where = f"container {c.get('name')} (image {c.get('image')})"
            if why in NEVER_PULLS:
                yield (
                    f"image:{c.get('name')}",
                    0,
                    f"{where} can never pull its image: {why} {detail}".rstrip(),
                )
            elif why in PULL_WAITS:
                yield (
                    f"image:{c.get('name')}",
                    s.image_pull_timeout_s,
                    f"{where} has not pulled its image for {s.image_pull_timeout_s:g} s: {why} "
                    f"{detail}".rstrip(),
                )
            elif why in CONFIG_WAITS:
                yield (
                    f"config:{c.get('name')}",
                    s.image_pull_timeout_s,
                    f"{where} cannot start: {why} {detail}".rstrip(),
                )
            elif why == "CrashLoopBackOff" and c.get("restartCount", 0) >= s.crash_loop_restarts:
                yield (
                    f"crash:{c.get('name')}",
                    0,
                    f"{where} crashed {c.get('restartCount')} times (CrashLoopBackOff)",
                )

    def _events(self, pod: str) -> str:
        try:
            events = self.api.list_events(self.namespace, pod)
        except Exception as exc:
            return f"\n(could not read its events: {exc})"
        lines = [
            f"  {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}".rstrip()
            for e in events[-EVENTS_SHOWN:]
        ]
        return "\nits last events:\n" + "\n".join(lines) if lines else ""
