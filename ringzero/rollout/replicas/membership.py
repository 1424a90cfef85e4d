"""Which replicas serve: their clients, the ones that are down and why, and finding them again.

A replica that does not answer (``ServerUnreachable``: refused or reset connection, timeout, 5xx after the
client's retries) is marked down (``lose``). ``recover`` finds the replicas again (``resolver``: the DNS
records of the headless Service, or the explicit list), drops a down replica whose address no longer
resolves (its pod was replaced), adds new ones as down, and hands every down replica that answers
``/health`` to ``bring_back``, which brings it to the current weights and returns those that hold them: only
they serve again. A down replica is looked for again at the start of a call at most every ``recheck_s``
(``due``): a dead address can take a connect timeout to answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from ringzero.errors import RingzeroError
from ringzero.rollout.types import ServerClient

log = structlog.get_logger(__name__)

BringBack = Callable[[list[ServerClient]], list[ServerClient]]


class Membership:
    def __init__(
        self,
        clients: list[ServerClient],
        connect: Callable[[str], ServerClient],
        resolver: Callable[[], list[str]],
        *,
        recheck_s: float,
        rejoin_wait_s: float,
    ):
        self.clients, self.connect, self.resolver = clients, connect, resolver
        self.recheck_s, self.rejoin_wait_s = recheck_s, rejoin_wait_s
        self.down: dict[str, str] = {}  # endpoint -> why it is out of service
        self.recovered_at = float("-inf")
        self.rejoined = 0  # replicas brought back to the current weights (for logs and tests)

    def live(self) -> list[ServerClient]:
        return [c for c in self.clients if c.endpoint not in self.down]

    def due(self) -> bool:
        return bool(self.down) and time.monotonic() - self.recovered_at >= self.recheck_s

    def reasons(self) -> str:
        return "; ".join(f"{e}: {why}" for e, why in self.down.items())

    def lose(self, client: ServerClient, why: str) -> None:
        self.down[client.endpoint] = why[:300]
        log.warning("rollout.replica_down", replica=client.endpoint, error=why[:300])

    def live_or_wait(self, bring_back: BringBack) -> list[ServerClient]:
        """The live replicas; when none is, recover until one is back or ``rejoin_wait_s`` passes."""
        deadline = time.monotonic() + self.rejoin_wait_s
        while not self.live():
            self.recover(bring_back)
            if self.live():
                break
            if time.monotonic() > deadline:
                raise RingzeroError(f"rollout: every replica is down ({self.reasons()})")
            time.sleep(1.0)
        return self.live()

    def recover(self, bring_back: BringBack) -> None:
        self.recovered_at = time.monotonic()
        try:
            found = [e.rstrip("/") for e in self.resolver()]  # as a server's client keeps its endpoint
        except RingzeroError as exc:
            log.warning("rollout.resolve_failed", error=str(exc)[:300])
            found = []
        known = {c.endpoint for c in self.clients}
        for endpoint in found:
            if endpoint not in known:
                client = self.connect(endpoint)
                client.routing_shape = self.clients[0].routing_shape
                self.clients.append(client)
                self.down[client.endpoint] = "new replica, not yet at the current weights"
        for c in [c for c in self.clients if found and c.endpoint in self.down and c.endpoint not in found]:
            self.clients.remove(c)
            self.down.pop(c.endpoint)
            c.close()
        back = [c for c in self.clients if c.endpoint in self.down and c.health()]
        for client in bring_back(back) if back else []:
            self.down.pop(client.endpoint, None)
            self.rejoined += 1
