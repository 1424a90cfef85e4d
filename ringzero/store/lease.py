"""One writer per stage: a lease object in the store that a second job on the same stage cannot take.

    with StageLease(store, "runs/r1/stages/sft/LEASE") as lease:   # LeaseHeld if another job has it
        ...                                                         # a heartbeat thread renews it
        lease.check()                                               # LeaseLost if someone took it

The lease is a small document at ``key``: who holds it (``holder``, host, pid), a token unique to
this ``StageLease``, when it was taken and when it expires. It is created with the backend's
``put_if_absent``, so of two jobs racing for it exactly one wins. While held, a background thread
renews it every ``heartbeat_s`` (``ttl_s / 3`` by default), each time checking it is still its own.

A lease may be taken over when it is stale: its expiry has passed (its holder stopped renewing), or
its holder ran on this machine, in this pid namespace, and that process no longer exists (a rerun
after a killed job need not wait for the TTL). Takeover deletes the stale document only if it is
still the one judged stale, creates a fresh one with ``put_if_absent`` and reads it back.

What this does not cover: clocks must agree across machines to well within ``ttl_s`` (expiry is
wall-clock time written by the holder and compared by the others); and renewal and takeover are
read-then-write, so a holder that failed to renew for a whole TTL can, in a narrow window, overwrite
its successor's lease. The heartbeat notices at its next renewal and reports the lease ``lost``;
a stage should call ``check()`` before it publishes anything.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog

from ringzero.errors import IntegrityError, StoreError
from ringzero.store.backend import Backend, MissingObjectError, check_key
from ringzero.store.documents import decode_document, encode_document
from ringzero.store.manifest import COMMIT_FILE, STARTED_FILE

log = structlog.get_logger(__name__)

LEASE_KIND = "ringzero.stage_lease"
_TAKEOVER_ROUNDS = 5
_TORN_READS = 5  # a lease created by O_EXCL on a filesystem without hard links may be read half-written
_TORN_WAIT_S = 0.02


class LeaseHeld(StoreError):
    """Another job holds the stage lease; the message says who, since when, and what to do."""

    def __init__(self, uri: str, current: LeaseRecord, now: float):
        self.uri = uri
        self.holder = current.holder
        self.host = current.host
        self.pid = current.pid
        self.acquired_at = current.acquired_at
        self.expires_at = current.expires_at
        super().__init__(
            f"stage lease {uri} is held by {current.holder} (host {current.host}, pid {current.pid}), "
            f"taken {_when(current.acquired_at, now)}, expires {_when(current.expires_at, now)} unless its "
            f"heartbeat renews it. Another job is running this stage: wait for it to finish, or, if that job "
            f"is certainly dead, delete {uri} and start again."
        )


class LeaseLost(StoreError):
    """The heartbeat found this job's lease taken by someone else (or removed, or not renewed in time)."""


@dataclass(frozen=True)
class LeaseRecord:
    """The document stored at the lease key."""

    holder: str
    token: str  # unique to one StageLease object: what "our own lease" means
    host: str
    pid: int
    acquired_at: float  # seconds since the epoch
    renewed_at: float
    expires_at: float
    ttl_s: float
    # Which pids the holder's pid is comparable with: same machine boot and pid namespace (containers
    # sharing a hostname still differ here), and the process's start time, so a reused pid is not it.
    boot_id: str | None = None
    pid_namespace: str | None = None
    pid_started: int | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"kind": LEASE_KIND, **asdict(self)}

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> LeaseRecord:
        if not isinstance(doc, dict) or doc.get("kind") != LEASE_KIND:
            raise StoreError(f"{where} is not a stage lease (no {LEASE_KIND!r} document); is the key right?")
        try:
            return cls(
                holder=str(doc["holder"]),
                token=str(doc["token"]),
                host=str(doc["host"]),
                pid=int(doc["pid"]),
                acquired_at=float(doc["acquired_at"]),
                renewed_at=float(doc["renewed_at"]),
                expires_at=float(doc["expires_at"]),
                ttl_s=float(doc["ttl_s"]),
                boot_id=doc.get("boot_id"),
                pid_namespace=doc.get("pid_namespace"),
                pid_started=None if doc.get("pid_started") is None else int(doc["pid_started"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"{where}: malformed stage lease ({type(exc).__name__}: {exc})") from None


class StageLease:
    """Exclusive hold on ``key`` in ``store`` (a ``CheckpointStore``) for one job's run of a stage.

    ``holder`` names this job in messages (default: a fresh uuid, host and pid). ``acquire`` or
    ``with`` takes the lease or raises ``LeaseHeld``; ``release`` (or leaving the ``with`` block, by
    an exception or a ``SystemExit`` from a SIGTERM handler too) deletes it if it is still ours.
    """

    def __init__(
        self,
        store,
        key: str,
        holder: str | None = None,
        ttl_s: float = 120.0,
        heartbeat_s: float | None = None,
    ):
        if not ttl_s > 0:
            raise StoreError(f"lease ttl_s must be positive (got {ttl_s})")
        heartbeat_s = ttl_s / 3 if heartbeat_s is None else heartbeat_s
        if not 0 < heartbeat_s < ttl_s:
            raise StoreError(
                f"lease heartbeat_s must be positive and below ttl_s={ttl_s} (got {heartbeat_s})"
            )
        key = check_key(key, "lease key")
        if key.rpartition("/")[2] in (COMMIT_FILE, STARTED_FILE):
            raise StoreError(
                f"lease key {key!r}: {key.rpartition('/')[2]} is reserved for checkpoint markers"
            )
        self.store = store
        self.key = key
        self.ttl_s = float(ttl_s)
        self.heartbeat_s = float(heartbeat_s)
        self._identity = _process_identity()
        self.holder = holder or f"{uuid.uuid4().hex}@{self._identity['host']}:{self._identity['pid']}"
        self._token = uuid.uuid4().hex
        self._backend: Backend = store.backend
        self._record: LeaseRecord | None = None
        self._lost: str | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._record else "not held"
        return f"StageLease({self.uri}, holder={self.holder}, {state})"

    @property
    def uri(self) -> str:
        return self._backend.uri(self.key)

    @property
    def held(self) -> bool:
        """Acquired, not released, and not found lost by the heartbeat."""
        return self._record is not None and self._lost is None

    @property
    def lost(self) -> bool:
        """Whether a renewal found the lease no longer ours (taken over, deleted, or not renewed in time)."""
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        return self._lost

    def check(self) -> None:
        """Raise ``LeaseLost`` if the heartbeat found the lease lost, or ``StoreError`` if it is not held."""
        if self._lost is not None:
            raise LeaseLost(self._lost)
        if self._record is None:
            raise StoreError(f"stage lease {self.uri} is not held by {self.holder}: acquire it first")

    # -- taking and giving back ----------------------------------------------------------------

    def acquire(self) -> StageLease:
        """Take the lease, taking over a stale one; ``LeaseHeld`` if another job holds it."""
        with self._lock:
            if self._record is not None:
                self.check()
                return self
            self._lost = None
            for _round in range(_TAKEOVER_ROUNDS):
                now = time.time()
                mine = self._new_record(now)
                if self._backend.put_if_absent(
                    self.key, encode_document(mine.to_doc(), f"lease {self.key!r}")
                ):
                    current = self._read()
                    if current is not None and current.token == self._token:
                        return self._start(current)
                    continue  # deleted or replaced between our create and our read: judge again
                current = self._read()
                if current is None:
                    continue  # released meanwhile
                if current.token == self._token:
                    return self._start(current)
                stale = _stale_reason(current, now, self._identity)
                if stale is None:
                    raise LeaseHeld(self.uri, current, now)
                log.warning(
                    "store.lease_taking_over",
                    uri=self.uri,
                    holder=self.holder,
                    stale_holder=current.holder,
                    stale_host=current.host,
                    stale_pid=current.pid,
                    reason=stale,
                )
                self._delete_if_unchanged(current)
            raise StoreError(
                f"stage lease {self.uri}: could not take it in {_TAKEOVER_ROUNDS} rounds; other jobs keep "
                "creating and removing it at the same time. Is more than one job starting this stage?"
            )

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours; never touches another's lease."""
        self._stop_heartbeat()
        with self._lock:
            if self._record is None:
                return
            try:
                current = self._read()
                if current is not None and current.token == self._token:
                    self._backend.delete([self.key])
                    log.info("store.lease_released", uri=self.uri, holder=self.holder)
                else:
                    log.warning(
                        "store.lease_not_ours_on_release",
                        uri=self.uri,
                        holder=self.holder,
                        now_held_by=None if current is None else current.holder,
                    )
            finally:
                self._record = None

    def renew(self) -> bool:
        """Push the expiry ``ttl_s`` ahead if the lease is still ours; ``False`` (and ``lost``) if not."""
        with self._lock:
            if self._record is None or self._lost is not None:
                return False
            current = self._read()
            if current is None or current.token != self._token:
                who = (
                    "deleted"
                    if current is None
                    else f"taken by {current.holder} (host {current.host}, pid {current.pid})"
                )
                self._lost = f"stage lease {self.uri} held by {self.holder} was {who}"
                log.error("store.lease_lost", uri=self.uri, holder=self.holder, reason=self._lost)
                return False
            now = time.time()
            renewed = replace(current, renewed_at=now, expires_at=now + self.ttl_s)
            self._backend.write(self.key, encode_document(renewed.to_doc(), f"lease {self.key!r}"))
            self._record = renewed
            return True

    def __enter__(self) -> StageLease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except Exception as error:
            if exc_type is None:
                raise
            # Do not hide what ended the block; an unreleased lease expires after ttl_s anyway.
            log.error("store.lease_release_failed", uri=self.uri, holder=self.holder, error=str(error))

    # -- internals -----------------------------------------------------------------------------

    def _new_record(self, now: float) -> LeaseRecord:
        ident = self._identity
        return LeaseRecord(
            holder=self.holder,
            token=self._token,
            host=ident["host"],
            pid=ident["pid"],
            acquired_at=now,
            renewed_at=now,
            expires_at=now + self.ttl_s,
            ttl_s=self.ttl_s,
            boot_id=ident["boot_id"],
            pid_namespace=ident["pid_namespace"],
            pid_started=ident["pid_started"],
        )

    def _start(self, record: LeaseRecord) -> StageLease:
        self._record = record
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"lease-heartbeat:{self.key}", daemon=True
        )
        self._thread.start()
        log.info("store.lease_acquired", uri=self.uri, holder=self.holder, ttl_s=self.ttl_s)
        return self

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                if not self.renew():
                    return
            except Exception as exc:  # a store outage: keep trying while the lease has not expired
                record = self._record
                log.warning("store.lease_renew_failed", uri=self.uri, holder=self.holder, error=str(exc))
                if record is not None and time.time() >= record.expires_at:
                    with self._lock:
                        self._lost = (
                            f"stage lease {self.uri} held by {self.holder} expired: it could not be renewed "
                            f"for {self.ttl_s:g} s (last error: {exc})"
                        )
                    log.error("store.lease_lost", uri=self.uri, holder=self.holder, reason=self._lost)
                    return

    def _read(self) -> LeaseRecord | None:
        for attempt in range(_TORN_READS):
            try:
                data = self._backend.read(self.key)
            except MissingObjectError:
                return None
            try:
                return LeaseRecord.from_doc(decode_document(data, self.uri), self.uri)
            except IntegrityError:
                if attempt == _TORN_READS - 1:
                    raise
                time.sleep(_TORN_WAIT_S)  # still being written (see LocalBackend._create_exclusive)
        raise AssertionError("unreachable")

    def _delete_if_unchanged(self, stale: LeaseRecord) -> None:
        """Delete the lease if it is still the very document judged stale (same token, same renewal)."""
        current = self._read()
        if current is not None and (current.token, current.renewed_at) == (stale.token, stale.renewed_at):
            self._backend.delete([self.key])


def _stale_reason(record: LeaseRecord, now: float, me: dict[str, Any]) -> str | None:
    """Why ``record`` may be taken over, or ``None`` while its holder may still be alive and renewing."""
    if now >= record.expires_at:
        return f"expired {now - record.expires_at:.1f} s ago"
    same_pids = (
        record.host == me["host"]
        and record.boot_id == me["boot_id"]
        and record.pid_namespace == me["pid_namespace"]
    )
    if same_pids:
        alive, started = _process_state(record.pid)
        if not alive:
            return f"its process {record.pid} on this host is gone"
        if record.pid_started is not None and started is not None and started != record.pid_started:
            return f"its process {record.pid} on this host is gone (the pid now belongs to another process)"
    return None


def _process_identity() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": _pid_namespace(),
        "pid_started": _process_state(pid)[1],
    }


def _process_state(pid: int) -> tuple[bool, int | None]:
    """Whether ``pid`` is a live process (a zombie is not), and its start time in clock ticks since boot."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is not None:
        fields = stat.rpartition(")")[2].split()  # the command name in parentheses may hold spaces
        if len(fields) > 19:
            return fields[0] not in ("Z", "X"), int(fields[19])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except PermissionError:  # someone else's process: alive
        return True, None
    return True, None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _when(t: float, now: float) -> str:
    stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    delta = t - now
    return f"{stamp} (in {delta:.0f} s)" if delta >= 0 else f"{stamp} ({-delta:.0f} s ago)"
