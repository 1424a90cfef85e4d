"""``ReplicaSet``: the ``RolloutClient`` protocol over every SGLang replica, each reached at its own address.

Where the replicas are: an explicit list (``engines.rollout.endpoints``, or ``RINGZERO_ROLLOUT_ENDPOINTS``,
comma-separated, which wins so a test or an operator can point a run elsewhere), the DNS A records of a
headless Service (``engines.rollout.replica_dns``; only ready pods are published, and resolution waits
until ``replicas`` of them are), or one ``endpoint``. They are resolved once, when the client is built.

Sampling: the requests are cut into contiguous shares of about equal sample counts, one per replica
(a request and its ``n`` samples stay on one replica), sent concurrently, and put back in order.

Weight pushes reach every replica, in phases run concurrently across replicas: ``/pause_generation``
on all, then the update on all, then ``/continue_generation`` on all (also after a failure, on the
replicas that paused). A replica that refuses fails the push with an error naming it. Servers without
pause (``ringzero serve``) or without weight-update sessions (SGLang before mid-2026) answer 404 there,
and that phase is skipped for them.

- ``disk``: every replica loads the model folder at a local path (``update_weights_from_disk``); the
  path must be on a volume the servers mount (under ``weights_dir``). A store URI is refused: SGLang
  reads ``model_path`` from its own file system. ``accept_store_uris`` (``weight_sync: store``) lets
  them through for ``ringzero serve``, which reads its store.
- ``distributed`` (``DistributedReplicaSet``): the first push opens the weight group
  (``/init_weights_update_group`` on every replica while the trainer serves the group's store as rank 0);
  each push then posts ``/update_weights_from_distributed`` to every replica and broadcasts the tensors
  from rank 0 while those calls wait, inside ``/begin_weight_update`` .. ``/end_weight_update`` on servers
  that have such sessions.

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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import PurePosixPath

import structlog
import torch

from ringzero.errors import RingzeroError
from ringzero.rollout.clients.http_client import HttpRolloutClient, distributed_update_body, init_group_body
from ringzero.rollout.replicas.weight_group import (
    WeightGroup,
    free_port,
    open_group,
    own_address,
    rank_offsets,
)
from ringzero.rollout.types import Completion, GenerateRequest

log = structlog.get_logger(__name__)

ENDPOINTS_ENV = "RINGZERO_ROLLOUT_ENDPOINTS"
STALE_METRIC = "rollout/stale_samples"
_POLL_S = 0.02


def resolve_endpoints(engine, environ=os.environ, *, resolver=socket.getaddrinfo, sleep=time.sleep,
                      clock=time.monotonic) -> list[str]:
    """Every replica's ``http://host:port``, from the environment, the config's list, its DNS name or endpoint."""
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
        return [f"http://{_url_host(ip)}:{port}" for ip in _resolve(host, int(port), engine.replicas or 1,
                                                                    engine.timeout_s, resolver, sleep, clock)]
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
            raise RingzeroError(f"rollout replicas: {host} resolves to {len(found)} address(es) {found}, "
                                f"{want} expected, after {timeout_s:.0f}s{problem}")
        sleep(1.0)


class ReplicaSet:
    """``generate`` spread over the replicas; ``update_weights_from_disk`` reaching each of them."""

    shared = True
    """One set of servers serves every rank of a job: ``SpreadClient`` pushes weights from rank 0 only."""

    def __init__(self, endpoints: Sequence[str], *, stale: str = "refuse", weights_dir: str | None = None,
                 accept_store_uris: bool = False, timeout_s: float = 600.0, retries: int = 2,
                 backoff_s: float = 0.5):
        if not endpoints:
            raise RingzeroError("a replica set needs at least one endpoint")
        if stale not in ("refuse", "count"):
            raise RingzeroError(f"stale must be 'refuse' or 'count' (got {stale!r})")
        self.clients = [HttpRolloutClient(e, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
                        for e in endpoints]
        self.stale, self.weights_dir, self.accept_store_uris = stale, weights_dir, accept_store_uris
        self.timeout_s = timeout_s
        self.weight_version: str | None = None
        self.stale_samples = 0  # since the last pop_metrics
        self.stale_total = 0

    @property
    def endpoints(self) -> list[str]:
        return [c.endpoint for c in self.clients]

    def close(self) -> None:
        for c in self.clients:
            c.close()

    # --- RolloutClient ---

    def health(self) -> bool:
        return all(self._each(lambda c: c.health()))

    def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        requests = list(requests)
        shares = _shares([r.params.n for r in requests], len(self.clients))
        jobs = [(i, s) for i, s in enumerate(shares) if s.stop > s.start]
        outs = self._each(lambda c, s: c.generate(requests[s]), [(self.clients[i], s) for i, s in jobs],
                          what="generate")
        results: list[list[Completion]] = []
        for (i, _), out in zip(jobs, outs, strict=True):
            self._check_versions(self.clients[i].endpoint, [c for group in out for c in group])
            results.extend(out)
        return results

    def update_weights_from_disk(self, path: str, weight_version: str) -> None:
        """Every replica loads the model folder at ``path`` (a path the servers see: not a store URI)."""
        self._check_path(path)
        self._push(weight_version, lambda c: c.update_weights_from_disk(path, weight_version))

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
                f"rollout replica {endpoint}: {len(stale)} of {len(completions)} samples carry weight_version "
                f"{seen}, but the last push was {want!r} (engines.rollout.stale: refuse)"
            )
        self.stale_samples += len(stale)
        self.stale_total += len(stale)
        log.warning("rollout.stale_samples", replica=endpoint, stale=len(stale), of=len(completions),
                    versions=seen, expected=want)

    def _check_path(self, path: str) -> None:
        if self.accept_store_uris:
            return
        if "://" in path:
            raise RingzeroError(
                f"weight push {path!r}: SGLang loads model_path from its own file system, a store URI is not a "
                "path it can read; write the weights as a model folder on the volume trainer and servers share "
                "(engines.rollout.weights_dir) and push that path, or use weight_sync: distributed"
            )
        if not path.startswith("/"):
            raise RingzeroError(f"weight push {path!r}: give an absolute path (the servers resolve it, not us)")
        if self.weights_dir is not None:
            inside = PurePosixPath(path).is_relative_to(PurePosixPath(self.weights_dir))
            if not inside:
                raise RingzeroError(f"weight push {path!r}: not under engines.rollout.weights_dir "
                                    f"{self.weights_dir!r}, the only folder the servers mount")

    # --- fan-out ---

    def _push(self, weight_version: str, update: Callable, *, session: bool = False, fan_out: bool = True) -> None:
        """pause -> [begin] -> update -> [end] -> continue on every replica; continue runs after failures too.

        ``update(client)`` runs once per replica, or ``update()`` once when ``fan_out`` is off (it reaches
        every replica itself).
        """
        paused: list[HttpRolloutClient] = []
        try:
            answers = self._attempt(lambda c: c.pause_generation(), what=f"pause before push {weight_version!r}")
            paused = [c for c, a in zip(self.clients, answers, strict=True) if a is True]
            _raise_any(answers)
            begun = [False] * len(self.clients)
            if session:
                begun = self._each(lambda c: c.begin_weight_update(), what=f"begin push {weight_version!r}")
            if fan_out:
                self._each(update, what=f"weight push {weight_version!r}")
            else:
                update()
            ended = [(c,) for c, ok in zip(self.clients, begun, strict=True) if ok]
            if ended:
                self._each(lambda c: c.end_weight_update(), ended, what=f"end push {weight_version!r}")
        finally:
            if paused:
                self._each(lambda c: c.continue_generation(), [(c,) for c in paused],
                           what=f"continue after push {weight_version!r}")
        self.weight_version = str(weight_version)
        log.info("rollout.pushed", version=weight_version, replicas=len(self.clients))

    def _each(self, fn, args: list[tuple] | None = None, *, what: str = "call") -> list:
        """``fn(*a)`` for each ``a`` (default: each replica's client) concurrently; errors name the replica."""
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
            raise RingzeroError(f"rollout replica {client.endpoint} refused the {what}: {exc}") from None


class _Failed:
    def __init__(self, exc: Exception):
        self.exc = exc


def _raise_any(answers: list) -> None:
    problems = [a.exc for a in answers if isinstance(a, _Failed)]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RingzeroError("; ".join(str(p) for p in problems))


class DistributedReplicaSet(ReplicaSet):
    """A ``ReplicaSet`` whose ``update_weights`` broadcasts tensors to every replica over a torch.distributed group."""

    def __init__(self, endpoints: Sequence[str], *, tp_size: int = 1, backend: str = "nccl",
                 master_address: str | None = None, master_port: int = 0, group_name: str = "ringzero-weights",
                 sync_timeout_s: float = 600.0, dtype: torch.dtype | None = None, **kwargs):
        super().__init__(endpoints, **kwargs)
        self.dtype = dtype  # the rollout body dtype: half the bytes of fp32 masters under a bf16 body
        self.tp_size, self.backend, self.group_name = tp_size, backend, group_name
        self.master_address, self.master_port, self.sync_timeout_s = master_address, master_port, sync_timeout_s
        self.group: WeightGroup | None = None
        self.broken: str | None = None  # why the group cannot be used any more

    def update_weights(self, state_dict: dict[str, torch.Tensor], weight_version: str) -> None:
        """Send a ``HybridLM`` state dict to every replica under the checkpoint's tensor names (what SGLang's
        loader maps), cast to ``dtype`` when set; later samples carry the version."""
        if not state_dict:
            raise RingzeroError("update_weights: no tensors to send")
        from ringzero.model.hf_format import hf_tensors

        state_dict = {k: (v.to(self.dtype) if self.dtype is not None and v.is_floating_point() and
                          "expert_bias" not in k else v) for k, v in hf_tensors(state_dict).items()}
        if self.broken is not None:
            raise RingzeroError(f"weight group {self.group_name!r} is unusable after a failed push ({self.broken}); "
                                "the servers must be restarted")
        group = self.group or self._open_group()
        names = list(state_dict)
        tensors = [self._on_device(state_dict[n]) for n in names]
        body = distributed_update_body(names, [str(t.dtype).removeprefix("torch.") for t in tensors],
                                       [list(t.shape) for t in tensors], self.group_name, weight_version)
        try:
            self._push(weight_version, lambda: self._send(group, body, tensors), session=True, fan_out=False)
        except Exception as exc:
            # A broadcast may still be in flight on some ranks: the group's next collective would not line up.
            self.broken = str(exc)[:300]
            raise

    def _send(self, group: WeightGroup, body: dict, tensors: list[torch.Tensor]) -> None:
        """Post the update to every replica and broadcast while the posts wait; fail as soon as one refuses."""
        what = f"weight push {body['weight_version']!r}"
        with _Pool(len(self.clients)) as pool:
            posts = [pool.submit(self._named, lambda c: c.update_weights_from_distributed(
                body, timeout_s=self.sync_timeout_s), (c,), what) for c in self.clients]
            works = group.broadcast(tensors)
            _wait(works, posts, self.sync_timeout_s, f"broadcast of {len(tensors)} tensors")
            _results(posts)

    def _open_group(self) -> WeightGroup:
        address = self.master_address or own_address()
        port = self.master_port or free_port()
        world = 1 + len(self.clients) * self.tp_size
        bodies = [init_group_body(address, port, offset, world, self.group_name, self.backend)
                  for offset in rank_offsets(len(self.clients), self.tp_size)]
        with _Pool(len(self.clients) + 1) as pool:
            joins = [pool.submit(self._named, lambda c, b: c.init_weights_update_group(
                b, timeout_s=self.sync_timeout_s), (c, b), "weight group join")
                for c, b in zip(self.clients, bodies, strict=True)]
            opened = pool.submit(open_group, address, port, world, self.group_name, self.backend,
                                 self.sync_timeout_s)
            _wait([], [*joins, opened], self.sync_timeout_s, f"weight group {self.group_name!r} at {address}:{port}")
            _results(joins)
            self.group = opened.result()
        log.info("rollout.weight_group", address=address, port=port, world_size=world, backend=self.backend)
        return self.group

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if self.backend == "nccl" and t.device.type != "cuda":
            t = t.to(torch.device("cuda", torch.cuda.current_device()))
        return t.contiguous()


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


def _wait(works: list, futures: list[Future], timeout_s: float, what: str) -> None:
    """Until every work and future is done; the first failed future is raised at once, not after the rest."""
    deadline = time.monotonic() + timeout_s
    while True:
        for f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception()
        if all(w.is_completed() for w in works) and all(f.done() for f in futures):
            return
        if time.monotonic() > deadline:
            raise RingzeroError(f"{what}: not done after {timeout_s:.0f}s")
        time.sleep(_POLL_S)


class _Pool(ThreadPoolExecutor):
    """A thread pool that, left by an error, does not wait for calls still blocked on the other side (they end
    at their own timeouts)."""

    def __exit__(self, exc_type, exc, tb):
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
        return False


def _results(futures: list[Future]) -> list:
    problems = [f.exception() for f in futures if f.exception() is not None]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RingzeroError("; ".join(str(p) for p in problems))
    return [f.result() for f in futures]


def _url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
