"""Where the rollout replicas are: every replica's ``http://host:port``.

An explicit list (``engines.rollout.endpoints``, or ``RINGZERO_ROLLOUT_ENDPOINTS``, comma-separated, which
wins so a test or an operator can point a run elsewhere), the DNS A records of a headless Service
(``engines.rollout.replica_dns``; only ready pods are published, and resolution waits until ``replicas`` of
them are), or one ``endpoint``.
"""

from __future__ import annotations

import os
import socket
import time

from ringzero.errors import RingzeroError

ENDPOINTS_ENV = "RINGZERO_ROLLOUT_ENDPOINTS"


def resolve_endpoints(
    engine,
    environ=os.environ,
    *,
    resolver=socket.getaddrinfo,
    sleep=time.sleep,
    clock=time.monotonic,
    want: int | None = None,
    timeout_s: float | None = None,
) -> list[str]:
    """A DNS name is resolved until it has ``want`` records (default ``engines.rollout.replicas``) or
    ``timeout_s`` (default the engine's) passes; finding replicas again after a loss asks for one."""
    if environ.get(ENDPOINTS_ENV, "").strip():
        urls = [u.strip() for u in environ[ENDPOINTS_ENV].split(",") if u.strip()]
        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            raise RingzeroError(f"{ENDPOINTS_ENV}: endpoints must start with http:// or https:// (got {bad})")
        return urls
    if engine.endpoints:
        return list(engine.endpoints)
    if engine.replica_dns:
        host, _, port = engine.replica_dns.rpartition(":")
        want = want or engine.replicas or 1
        wait_s = engine.timeout_s if timeout_s is None else timeout_s
        return [
            f"http://{url_host(ip)}:{port}"
            for ip in _resolve(host, int(port), want, wait_s, resolver, sleep, clock)
        ]
    if engine.endpoint:
        return [engine.endpoint]
    raise RingzeroError("engines.rollout names no server: set endpoint, endpoints or replica_dns")


def _resolve(host: str, port: int, want: int, timeout_s: float, resolver, sleep, clock) -> list[str]:
    deadline, found, problem = clock() + timeout_s, [], ""
    while True:
        try:
            infos = resolver(host, port, type=socket.SOCK_STREAM)
            found = sorted({info[4][0] for info in infos})
        except OSError as exc:
            found, problem = [], f" ({exc})"
        if len(found) >= want:
            return found
        if clock() >= deadline:
            raise RingzeroError(
                f"rollout replicas: {host} resolves to {len(found)} address(es) {found}, "
                f"{want} expected, after {timeout_s:.0f}s{problem}"
            )
        sleep(1.0)


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
