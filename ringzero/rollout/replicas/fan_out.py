"""One call on many replicas at once, each failure named by its replica.

``attempt(fn, args, what)`` runs ``fn(*a)`` for each ``a`` (a replica's client first) on its own thread and
hands back each answer or ``Failed(exc)`` in its place; ``each`` raises the failures instead. A
``RingzeroError`` is renamed ``rollout replica <endpoint> refused the <what>: ...``, and a
``ServerUnreachable`` stays one, so the caller can tell a lost replica from a refusal.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ringzero.errors import RingzeroError, ServerUnreachable

POLL_S = 0.02


@dataclass(frozen=True)
class Failed:
    exc: Exception


def named(fn, a: tuple, what: str):
    """``fn(*a)``, its error naming the replica ``a[0]``."""
    try:
        return fn(*a)
    except RingzeroError as exc:
        kind = ServerUnreachable if isinstance(exc, ServerUnreachable) else RingzeroError
        raise kind(f"rollout replica {a[0].endpoint} refused the {what}: {exc}") from None


def attempt(fn, args: list[tuple], what: str) -> list:
    """Each ``fn(*a)``'s answer, or ``Failed`` in its place."""

    def caught(a: tuple):
        try:
            return named(fn, a, what)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, which raises it
            return Failed(exc)

    if len(args) == 1:
        return [caught(args[0])]
    with ThreadPoolExecutor(max_workers=max(1, len(args))) as pool:
        return list(pool.map(caught, args))


def each(fn, args: list[tuple], what: str) -> list:
    """``attempt``, raising its failures (all of them named in one error when several failed)."""
    answers = attempt(fn, args, what)
    raise_any([a.exc for a in answers if isinstance(a, Failed)])
    return answers


def raise_any(problems: list[BaseException]) -> None:
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise RingzeroError("; ".join(str(p) for p in problems))


class Pool(ThreadPoolExecutor):
    """A thread pool that, left by an error, does not wait for calls still blocked on the other side (they end
    at their own timeouts)."""

    def __exit__(self, exc_type, exc, tb):
        self.shutdown(wait=exc_type is None, cancel_futures=exc_type is not None)
        return False


def wait_all(works: list, futures: list[Future], timeout_s: float, what: str) -> None:
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
        time.sleep(POLL_S)


def results(futures: list[Future]) -> list:
    raise_any([f.exception() for f in futures if f.exception() is not None])
    return [f.result() for f in futures]
