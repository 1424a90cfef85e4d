"""``ReplicaSet``: the ``RolloutClient`` protocol over every SGLang replica, each reached at its own address.

Where the replicas are: an explicit list (``engines.rollout.endpoints``, or ``RINGZERO_ROLLOUT_ENDPOINTS``,
comma-separated, which wins so a test or an operator can point a run elsewhere), the DNS A records of a
headless Service (``engines.rollout.replica_dns``; only ready pods are published, and resolution waits
until ``replicas`` of them are), or one ``endpoint``. They are resolved when the client is built, and again
after a replica is lost (see below).

Sampling: the requests are cut into contiguous shares of about equal sample counts, one per replica
(a request and its ``n`` samples stay on one replica), sent concurrently, and put back in order.

Weight pushes reach every replica, in phases run concurrently across replicas: ``/pause_generation``
on all, then the update on all, then ``/continue_generation`` on all (also after a failure, on the
replicas that paused). A replica that refuses fails the push with an error naming it (one that does not
answer is skipped, see below). Servers without
pause (``ringzero serve``) or without weight-update sessions (SGLang before mid-2026) answer 404 there,
and that phase is skipped for them.

- ``disk``: every replica loads the model folder at a local path (``update_weights_from_disk``); the
  path must be on a volume the servers mount (under ``weights_dir``). A store URI is refused: SGLang
  reads ``model_path`` from its own file system. ``accept_store_uris`` (``weight_sync: store``) lets
  them through for ``ringzero serve``, which reads its store.
- ``distributed`` (``DistributedReplicaSet``, in ``distributed_set``): the first push opens the weight group
  (``/init_weights_update_group`` on every replica while the trainer serves the group's store as rank 0);
  each push then posts ``/update_weights_from_distributed`` to every replica and broadcasts the tensors
  from rank 0 while those calls wait, inside ``/begin_weight_update`` .. ``/end_weight_update`` on servers
  that have such sessions.

Lost replicas: a replica that does not answer (``ServerUnreachable``: refused or reset connection, timeout,
5xx after the client's retries) is marked down and its share of a ``generate`` is sent again to the live
replicas. Then the replicas are found again (``resolver``: the DNS records of the headless Service, or the
explicit list), and every down or new replica that answers ``/health`` is brought to the current weights
before it serves again: the last push replayed to it (disk and store pushes: the same folder or URI;
distributed: the weight group rebuilt with every live replica under a new name and port, and the last
tensors sent again), then its ``weight_version`` read back and required to be the last pushed one. A
replica whose samples carry another version is asked which version it holds: one that lost its weights
(restarted between calls) is caught up the same way and its share resampled; one that holds the current
version but returned older tokens is stale as below. A push skips replicas that are down (they are
caught up when they return) and fails only when no replica is left.

Versions: each completion's ``meta_info.weight_version`` (and, on SGLang versions that report them, every
span of ``meta_info.weight_versions``) must be the version last pushed. A stale batch is refused
(``stale: refuse``) or kept and counted (``stale: count``); ``pop_metrics`` reports the count since the
last call as ``rollout/stale_samples``. Before the first push nothing is checked.
"""

from __future__ import annotations

import bisect
import itertools
import os
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import PurePosixPath

import structlog

from ringzero.errors import RingzeroError, ServerUnreachable
from ringzero.rollout.types import Completion, GenerateRequest, ServerClient

log = structlog.get_logger(__name__)

ENDPOINTS_ENV = "RINGZERO_ROLLOUT_ENDPOINTS"
STALE_METRIC = "rollout/stale_samples"
_POLL_S = 0.02


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
    """Every replica's ``http://host:port``, from the environment, the config's list, its DNS name or
    endpoint.

    A DNS name is resolved until it has ``want`` records (default ``engines.rollout.replicas``) or
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
            f"http://{_url_host(ip)}:{port}"
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


class ReplicaSet:
    """``generate`` spread over the replicas; ``update_weights_from_disk`` reaching each of them."""

    shared = True
    """One set of servers serves every rank of a job: ``SpreadClient`` pushes weights from rank 0 only."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        connect: Callable[..., ServerClient],
        stale: str = "refuse",
        weights_dir: str | None = None,
        accept_store_uris: bool = False,
        timeout_s: float = 600.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        resolver: Callable[[], list[str]] | None = None,
        recoveries: int = 3,
        rejoin_wait_s: float = 30.0,
        recheck_s: float = 30.0,
    ):
        if not endpoints:
            raise RingzeroError("a replica set needs at least one endpoint")
        if stale not in ("refuse", "count"):
            raise RingzeroError(f"stale must be 'refuse' or 'count' (got {stale!r})")
        self._client_args = dict(timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        # One server's client, built by the deployment (the HTTP client of SGLang's API): a replica set only
        # spreads, checks versions and recovers, whatever speaks to each server.
        self.connect = connect
        self.clients = [connect(e, **self._client_args) for e in endpoints]
        self.stale, self.weights_dir, self.accept_store_uris = stale, weights_dir, accept_store_uris
        self.timeout_s = timeout_s
        self.weight_version: str | None = None
        self.stale_samples = 0  # since the last pop_metrics
        self.stale_total = 0
        # Lost replicas: where to find the replicas again, how often a call recovers, how long it waits
        # for a lost replica to come back when none is left.
        self.resolver = resolver or (lambda: [c.endpoint for c in self.clients])
        self.recoveries, self.rejoin_wait_s = recoveries, rejoin_wait_s
        # A down replica is looked for again at the start of a call at most this often (a dead address
        # can take a connect timeout to answer).
        self.recheck_s, self._recovered_at = recheck_s, float("-inf")
        self.down: dict[str, str] = {}  # endpoint -> why it is out of service
        self._replay: Callable[[ServerClient], None] | None = None  # the last push, for one replica
        self.rejoined = 0  # replicas brought back to the current weights (a counter for logs and tests)

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.clients]

    def close(self) -> None:
        for c in self.clients:
            c.close()

    # --- RolloutClient ---

    def health(self) -> bool:
        return all(self._each(lambda c: c.health()))

    def live(self) -> list[ServerClient]:
        return [c for c in self.clients if c.endpoint not in self.down]

    def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Each request sampled on one live replica; a share lost with its replica is sampled again."""
        requests = list(requests)
        if not requests:
            return []
        if self.down and time.monotonic() - self._recovered_at >= self.recheck_s:
            self.recover()  # a lost replica that answers again is caught up and serves this call
        results: list[list[Completion] | None] = [None] * len(requests)
        todo = list(range(len(requests)))
        for round_ in range(1 + self.recoveries):
            live = self._live_or_wait()
            shares = _shares([requests[i].params.n for i in todo], len(live))
            jobs = [(live[k], todo[s]) for k, s in enumerate(shares) if s.stop > s.start]
            answers = self._attempt(
                lambda c, idx: c.generate([requests[i] for i in idx]), jobs, what="generate"
            )
            again: list[int] = []
            for (client, idx), out in zip(jobs, answers, strict=True):
                if isinstance(out, _Failed):
                    if not isinstance(out.exc, ServerUnreachable):
                        raise out.exc
                    self._lose(client, out.exc)
                    again += idx
                    continue
                completions = [c for group in out for c in group]
                if self._lost_its_weights(client, completions):
                    again += idx
                else:
                    self._check_versions(client.endpoint, completions)
                    for i, group in zip(idx, out, strict=True):
                        results[i] = group
            if not again:
                return results  # type: ignore[return-value]
            todo = sorted(again)
            log.warning("rollout.resample", requests=len(todo), round=round_ + 1, down=sorted(self.down))
            self.recover()
        raise RingzeroError(
            f"rollout: {len(todo)} requests still unanswered after {self.recoveries} recoveries "
            f"from lost replicas ({self._down_reasons()})"
        )

    # --- lost replicas ---

    def _down_reasons(self) -> str:
        return "; ".join(f"{e}: {why}" for e, why in self.down.items())

    def _lose(self, client: ServerClient, exc: Exception) -> None:
        self.down[client.endpoint] = str(exc)[:300]
        log.warning("rollout.replica_down", replica=client.endpoint, error=str(exc)[:300])

    def _lost_its_weights(self, client: ServerClient, completions: list[Completion]) -> bool:
        """Samples from another version than the last push, from a replica that no longer holds that push
        (it restarted): marked down to be caught up, its samples dropped. False for a replica that does hold
        the push (its stale samples are counted or refused by ``_check_versions``)."""
        want = self.weight_version
        if want is None or all(_versions(c) == {want} for c in completions):
            return False
        try:
            held = client.served_weight_version()
        except ServerUnreachable as exc:
            self._lose(client, exc)
            return True
        except RingzeroError:
            return False  # it cannot say: its samples are judged as stale
        if held == want:
            return False
        self._lose(
            client, RingzeroError(f"holds weight_version {held!r}, not the last push {want!r} (restarted?)")
        )
        return True

    def _live_or_wait(self) -> list[ServerClient]:
        """The live replicas; when none is, recover until one is back or ``rejoin_wait_s`` passes."""
        deadline = time.monotonic() + self.rejoin_wait_s
        while not self.live():
            self.recover()
            if self.live():
                break
            if time.monotonic() > deadline:
                raise RingzeroError(f"rollout: every replica is down ({self._down_reasons()})")
            time.sleep(1.0)
        return self.live()

    def recover(self) -> None:
        """Find the replicas again, and bring each down or new one that answers back to the current
        weights."""
        self._recovered_at = time.monotonic()
        try:
            found = self.resolver()
        except RingzeroError as exc:
            log.warning("rollout.resolve_failed", error=str(exc)[:300])
            found = []
        found = [e.rstrip("/") for e in found]  # as a server's client keeps its endpoint
        known = {c.endpoint for c in self.clients}
        for endpoint in found:
            if endpoint not in known:
                client = self.connect(endpoint, **self._client_args)
                client.routing_shape = self.clients[0].routing_shape
                self.clients.append(client)
                self.down[client.endpoint] = "new replica, not yet at the current weights"
        # A down replica whose address no longer resolves is gone for good (its pod was replaced).
        gone = [c for c in self.clients if found and c.endpoint in self.down and c.endpoint not in found]
        for c in gone:
            self.clients.remove(c)
            self.down.pop(c.endpoint)
            c.close()
        back = [c for c in self.clients if c.endpoint in self.down and c.health()]
        if back:
            self._rejoin(back)

    def _rejoin(self, back: list[ServerClient]) -> None:
        """Replay the last push to replicas that came back, check their version, and put them in service."""
        if self.weight_version is not None:
            self._catch_up(back)
        for client in back:
            if self.weight_version is not None:
                try:
                    held = client.served_weight_version()
                except RingzeroError as exc:
                    self.down[client.endpoint] = str(exc)[:300]
                    continue
                if held != self.weight_version:
                    self.down[client.endpoint] = (
                        f"holds weight_version {held!r} after the catch-up, not {self.weight_version!r}"
                    )
                    continue
            self.down.pop(client.endpoint, None)
            self.rejoined += 1
            log.info("rollout.replica_rejoined", replica=client.endpoint, version=self.weight_version)

    def _catch_up(self, back: list[ServerClient]) -> None:
        """The last push, replayed to each replica in ``back`` (its version is checked afterwards)."""
        if self._replay is None:  # another rank pushed: that rank catches it up; here its version is checked
            return
        for client in back:
            try:
                self._replay(client)
            except RingzeroError as exc:
                log.warning("rollout.rejoin_failed", replica=client.endpoint, error=str(exc)[:300])

    def update_weights_from_disk(self, path: str, weight_version: str) -> None:
        """Every replica loads the model folder at ``path`` (a path the servers see: not a store URI)."""
        self._check_path(path)

        def update(client: ServerClient) -> None:
            client.update_weights_from_disk(path, weight_version)

        self._push(weight_version, lambda clients: self._push_to(clients, weight_version, update))
        self._replay = lambda client: self._push_to([client], weight_version, update)

    # --- versions ---

    def expect_version(self, weight_version: str) -> None:
        """The version another rank pushed: later completions must carry it."""
        self.weight_version = str(weight_version)

    def pop_metrics(self) -> dict[str, float]:
        out, self.stale_samples = {STALE_METRIC: float(self.stale_samples)}, 0
        return out

    def _check_versions(self, endpoint: str, completions: list[Completion]) -> None:
        want = self.weight_version
        if want is None:
            return
        stale = [c for c in completions if _versions(c) != {want}]
        if not stale:
            return
        seen = sorted({v for c in stale for v in _versions(c)})
        if self.stale == "refuse":
            raise RingzeroError(
                f"rollout replica {endpoint}: {len(stale)} of {len(completions)} samples carry "
                "weight_version "
                f"{seen}, but the last push was {want!r} (engines.rollout.stale: refuse)"
            )
        self.stale_samples += len(stale)
        self.stale_total += len(stale)
        log.warning(
            "rollout.stale_samples",
            replica=endpoint,
            stale=len(stale),
            of=len(completions),
            versions=seen,
            expected=want,
        )

    def _check_path(self, path: str) -> None:
        if self.accept_store_uris:
            return
        if "://" in path:
            raise RingzeroError(
                f"weight push {path!r}: SGLang loads model_path from its own file system, a store URI is not "
                "a "
                "path it can read; write the weights as a model folder on the volume trainer and servers "
                "share "
                "(engines.rollout.weights_dir) and push that path, or use weight_sync: distributed"
            )
        if not path.startswith("/"):
            raise RingzeroError(
                f"weight push {path!r}: give an absolute path (the servers resolve it, not us)"
            )
        if self.weights_dir is not None:
            inside = PurePosixPath(path).is_relative_to(PurePosixPath(self.weights_dir))
            if not inside:
                raise RingzeroError(
                    f"weight push {path!r}: not under engines.rollout.weights_dir "
                    f"{self.weights_dir!r}, the only folder the servers mount"
                )

    # --- fan-out ---

    def _push(self, weight_version: str, push: Callable[[list[ServerClient]], None]) -> None:
        """``push(clients)`` to the live replicas; one that does not answer is marked down and caught up when
        it returns, and a replica lost during the push makes it run once more on the ones that still answer.
        Fails when no replica is left."""
        for attempt in range(2):
            self._drop_silent()
            try:
                push(self._live_or_wait())
                break
            except ServerUnreachable:
                if attempt:  # a replica lost during the push: pushed again to the ones that still answer
                    raise
                log.warning("rollout.push_retry", version=weight_version)
        self.weight_version = str(weight_version)
        log.info("rollout.pushed", version=weight_version, replicas=len(self.live()), down=sorted(self.down))

    def _drop_silent(self) -> None:
        """Mark down the live replicas that do not answer (a push skips them)."""
        live = self.live()
        answers = self._attempt(lambda c: c.reachable(), [(c,) for c in live], what="health")
        for c, ok in zip(live, answers, strict=True):
            if ok is not True:
                self._lose(c, ServerUnreachable(f"{c.endpoint}: no answer to /health before a push"))

    def _push_to(
        self,
        clients: list[ServerClient],
        weight_version: str,
        update: Callable,
        *,
        session: bool = False,
        fan_out: bool = True,
    ) -> None:
        """pause -> [begin] -> update -> [end] -> continue on ``clients``; continue runs after failures too.

        ``update(client)`` runs once per replica, or ``update()`` once when ``fan_out`` is off (it reaches
        every replica itself).
        """
        paused: list[ServerClient] = []
        every = [(c,) for c in clients]
        try:
            answers = self._attempt(
                lambda c: c.pause_generation(), every, what=f"pause before push {weight_version!r}"
            )
            paused = [c for c, a in zip(clients, answers, strict=True) if a is True]
            _raise_any(answers)
            begun = [False] * len(clients)
            if session:
                begun = self._each(
                    lambda c: c.begin_weight_update(), every, what=f"begin push {weight_version!r}"
                )
            if fan_out:
                self._each(update, every, what=f"weight push {weight_version!r}")
            else:
                update()
            ended = [(c,) for c, ok in zip(clients, begun, strict=True) if ok]
            if ended:
                self._each(lambda c: c.end_weight_update(), ended, what=f"end push {weight_version!r}")
        finally:
            if paused:
                self._each(
                    lambda c: c.continue_generation(),
                    [(c,) for c in paused],
                    what=f"continue after push {weight_version!r}",
                )

    def _each(self, fn, args: list[tuple] | None = None, *, what: str = "call") -> list:
        """``fn(*a)`` for each ``a`` (default: each replica's client) concurrently; errors name the
        replica."""
        answers = self._attempt(fn, args, what=what)
        _raise_any(answers)
        return answers

    def _attempt(self, fn, args: list[tuple] | None = None, *, what: str = "call") -> list:
        """Like ``_each``, but each failure comes back in its replica's place instead of being raised."""
        args = [(c,) for c in self.clients] if args is None else args
        if len(args) == 1:
            return [self._caught(fn, args[0], what)]
        with ThreadPoolExecutor(max_workers=len(args)) as pool:
            return [f.result() for f in [pool.submit(self._caught, fn, a, what) for a in args]]

    def _caught(self, fn, a: tuple, what: str):
        try:
            return self._named(fn, a, what)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, which raises it
            return _Failed(exc)

    def _named(self, fn, a: tuple, what: str):
        try:
            return fn(*a)
        except RingzeroError as exc:
            client = a[0]
            kind = ServerUnreachable if isinstance(exc, ServerUnreachable) else RingzeroError
            raise kind(f"rollout replica {client.endpoint} refused the {what}: {exc}") from None


class _Failed:
    def __init__(self, exc: Exception):
        self.exc = exc


def _raise_any(answers: list) -> None:
    problems = [a.exc for a in answers if isinstance(a, _Failed)]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RingzeroError("; ".join(str(p) for p in problems))


def _versions(c: Completion) -> set[str]:
    """The version the completion reports and every version its tokens span (SGLang's ``weight_versions``)."""
    spans = c.meta.get("weight_versions") or []
    return {c.weight_version, *(str(s.get("version")) for s in spans if isinstance(s, dict))}


def _shares(samples: list[int], parts: int) -> list[slice]:
    """Contiguous slices of the requests, one per part, cut where the running sample count is nearest an
    equal share (some parts may be empty when there are fewer requests than parts)."""
    cum = list(itertools.accumulate(samples, initial=0))
    bounds = [0]
    for p in range(1, parts):
        target = cum[-1] * p / parts
        i = bisect.bisect_left(cum, target)
        if i > 0 and target - cum[i - 1] <= (cum[i] - target if i < len(cum) else float("inf")):
            i -= 1
        bounds.append(min(max(i, bounds[-1]), len(samples)))
    bounds.append(len(samples))
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
