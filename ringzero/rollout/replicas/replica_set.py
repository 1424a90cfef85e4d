"""``ReplicaSet``: the ``RolloutClient`` protocol over every SGLang replica, each reached at its own address.

The replicas are found by ``endpoints.resolve_endpoints`` when the client is built, and again after a
replica is lost (``membership``). Calls fan out over them with ``fan_out``.

Sampling: the requests are cut into contiguous shares of about equal sample counts, one per replica
(a request and its ``n`` samples stay on one replica), sent concurrently, and put back in order.

Weight pushes reach every live replica in the phases of ``push_phases`` (pause, update, continue). A
replica that refuses fails the push with an error naming it (one that does not answer is skipped, see
below).

- ``disk``: every replica loads the model folder at a local path (``update_weights_from_disk``); the
  path must be on a volume the servers mount (under ``weights_dir``). A store URI is refused: SGLang
  reads ``model_path`` from its own file system. ``accept_store_uris`` (``weight_sync: store``) lets
  them through for ``ringzero serve``, which reads its store.
- ``distributed`` (``DistributedReplicaSet``, in ``distributed_set``): the first push opens the weight group
  (``/init_weights_update_group`` on every replica while the trainer serves the group's store as rank 0);
  each push then posts ``/update_weights_from_distributed`` to every replica and broadcasts the tensors
  from rank 0 while those calls wait, inside ``/begin_weight_update`` .. ``/end_weight_update`` on servers
  that have such sessions.

Lost replicas (``membership``): a replica that does not answer is marked down and its share of a
``generate`` is sent again to the live replicas. Every down or new replica that answers again is brought to
the current weights before it serves again: the last push replayed to it (disk and store pushes: the same
folder or URI; distributed: the weight group rebuilt with every live replica under a new name and port, and
the last tensors sent again), then its ``weight_version`` read back and required to be the last pushed one.
A replica whose samples carry another version is asked which version it holds: one that lost its weights
(restarted between calls) is caught up the same way and its share resampled; one that holds the current
version but returned older tokens is stale as below. A push skips replicas that are down (they are caught
up when they return) and fails only when no replica is left.

Versions: each completion's ``meta_info.weight_version`` (and, on SGLang versions that report them, every
span of ``meta_info.weight_versions``) must be the version last pushed. A stale batch is refused
(``stale: refuse``) or kept and counted (``stale: count``); ``pop_metrics`` reports the count since the
last call as ``rollout/stale_samples``. Before the first push nothing is checked.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

import structlog

from ringzero.errors import RingzeroError, ServerUnreachable
from ringzero.rollout.replicas.fan_out import Failed, attempt, each
from ringzero.rollout.replicas.membership import Membership
from ringzero.rollout.replicas.push_phases import EachReplica, push_phases
from ringzero.rollout.types import Completion, GenerateRequest, ServerClient

log = structlog.get_logger(__name__)

STALE_METRIC = "rollout/stale_samples"


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
        # One server's client, built by the deployment (the HTTP client of SGLang's API): a replica set only
        # spreads, checks versions and recovers, whatever speaks to each server.
        client_args = dict(timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        clients = [connect(e, **client_args) for e in endpoints]
        self.membership = Membership(
            clients,
            lambda endpoint: connect(endpoint, **client_args),
            resolver or (lambda: [c.endpoint for c in self.membership.clients]),
            recheck_s=recheck_s,
            rejoin_wait_s=rejoin_wait_s,
        )
        self.stale, self.weights_dir, self.accept_store_uris = stale, weights_dir, accept_store_uris
        self.timeout_s, self.recoveries = timeout_s, recoveries
        self.weight_version: str | None = None
        self.stale_samples = 0  # since the last pop_metrics
        self.stale_total = 0
        self.last_disk_push: tuple[str, str] | None = None  # (path, version), replayed to a returning replica

    @property
    def clients(self) -> list[ServerClient]:
        return self.membership.clients

    @property
    def down(self) -> dict[str, str]:
        return self.membership.down

    @property
    def rejoined(self) -> int:
        return self.membership.rejoined

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.clients]

    def close(self) -> None:
        for c in self.clients:
            c.close()

    # --- RolloutClient ---

    def health(self) -> bool:
        return all(each(lambda c: c.health(), [(c,) for c in self.clients], "health"))

    def live(self) -> list[ServerClient]:
        return self.membership.live()

    def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """Each request sampled on one live replica; a share lost with its replica is sampled again."""
        requests = list(requests)
        if not requests:
            return []
        if self.membership.due():
            self.recover()  # a lost replica that answers again is caught up and serves this call
        results: list[list[Completion] | None] = [None] * len(requests)
        todo = list(range(len(requests)))
        for round_ in range(1 + self.recoveries):
            live = self.membership.live_or_wait(self._bring_back)
            shares = _shares([requests[i].params.n for i in todo], len(live))
            jobs = [(live[k], todo[s]) for k, s in enumerate(shares) if s.stop > s.start]
            answers = attempt(lambda c, idx: c.generate([requests[i] for i in idx]), jobs, "generate")
            again: list[int] = []
            for (client, idx), out in zip(jobs, answers, strict=True):
                if isinstance(out, Failed):
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
            f"from lost replicas ({self.membership.reasons()})"
        )

    # --- lost replicas ---

    def recover(self) -> None:
        """Find the replicas again; each down or new one that answers is brought to the current weights."""
        self.membership.recover(self._bring_back)

    def _lose(self, client: ServerClient, exc: Exception) -> None:
        self.membership.lose(client, str(exc))

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

    def _bring_back(self, back: list[ServerClient]) -> list[ServerClient]:
        """Replay the last push to replicas that came back; those that then hold its version serve again."""
        if self.weight_version is None:
            return back
        self._catch_up(back)
        ready = []
        for client in back:
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
            ready.append(client)
            log.info("rollout.replica_rejoined", replica=client.endpoint, version=self.weight_version)
        return ready

    def _catch_up(self, back: list[ServerClient]) -> None:
        """The last push, replayed to each replica in ``back`` (its version is checked afterwards). Without
        one here another rank pushed: that rank catches it up."""
        if self.last_disk_push is None:
            return
        path, version = self.last_disk_push
        for client in back:
            try:
                push_phases([client], version, _load_folder(path, version))
            except RingzeroError as exc:
                log.warning("rollout.rejoin_failed", replica=client.endpoint, error=str(exc)[:300])

    def update_weights_from_disk(self, path: str, weight_version: str) -> None:
        """Every replica loads the model folder at ``path`` (a path the servers see: not a store URI)."""
        self._check_path(path)
        self._push(
            weight_version,
            lambda clients: push_phases(clients, weight_version, _load_folder(path, weight_version)),
        )
        self.last_disk_push = (path, weight_version)

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

    # --- pushes ---

    def _push(self, weight_version: str, push: Callable[[list[ServerClient]], None]) -> None:
        """``push(clients)`` to the live replicas; one that does not answer is marked down and caught up when
        it returns, and a replica lost during the push makes it run once more on the ones that still answer.
        Fails when no replica is left."""
        for tries in range(2):
            self._drop_silent()
            try:
                push(self.membership.live_or_wait(self._bring_back))
                break
            except ServerUnreachable:
                if tries:  # a replica lost during the push: pushed again to the ones that still answer
                    raise
                log.warning("rollout.push_retry", version=weight_version)
        self.weight_version = str(weight_version)
        log.info("rollout.pushed", version=weight_version, replicas=len(self.live()), down=sorted(self.down))

    def _drop_silent(self) -> None:
        """Mark down the live replicas that do not answer (a push skips them)."""
        live = self.live()
        for c, ok in zip(live, attempt(lambda c: c.reachable(), [(c,) for c in live], "health"), strict=True):
            if ok is not True:
                self._lose(c, ServerUnreachable(f"{c.endpoint}: no answer to /health before a push"))


def _load_folder(path: str, version: str) -> EachReplica:
    return EachReplica(lambda client: client.update_weights_from_disk(path, version))


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
