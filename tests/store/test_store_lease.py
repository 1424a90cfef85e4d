"""Stage leases: one writer per stage, on file:// and on S3 (moto; the Ceph RGW when it runs)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import urllib3
from minio.error import S3Error
from store_kit import FAST_RETRIES

from ringzero.errors import RingzeroError, StoreError
from ringzero.store import open_store
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV
from ringzero.store.lease import LeaseHeld, LeaseLost, LeaseRecord, StageLease

KEY = "runs/r1/stages/sft/LEASE"
REPO = Path(__file__).resolve().parents[2]

MOTO = pytest.param("moto", marks=[pytest.mark.s3, pytest.mark.xdist_group("store-moto")], id="moto")
RGW = pytest.param(
    "rgw", marks=[pytest.mark.s3, pytest.mark.rgw, pytest.mark.xdist_group("store-rgw")], id="rgw"
)


@pytest.fixture(params=["file", MOTO, RGW])
def store(request, tmp_path, monkeypatch):
    if request.param == "file":
        store = open_store(f"file://{tmp_path}/store")
        store.child_spec = {"root": store.uri}
        return store
    target = request.getfixturevalue(f"{request.param}_target")
    for var in (ACCESS_KEY_ENV, SECRET_KEY_ENV):
        monkeypatch.delenv(f"{var}_FILE", raising=False)
    monkeypatch.setenv(ACCESS_KEY_ENV, target.access_key)
    monkeypatch.setenv(SECRET_KEY_ENV, target.secret_key)
    store = open_store(f"s3://{target.new_bucket()}/ckpts", target.settings())
    store.child_spec = {"root": store.uri, "endpoint": target.endpoint}
    return store


@pytest.fixture
def atomic_moto(monkeypatch):
    """moto checks If-None-Match and then stores the object without a lock, so two racing creators can
    both pass the check; S3 servers do it atomically. Make moto do the same for the race tests."""
    from moto.s3.responses import S3Response

    lock, real = threading.Lock(), S3Response.put_object

    def put_object(self, *args, **kwargs):
        with lock:
            return real(self, *args, **kwargs)

    monkeypatch.setattr(S3Response, "put_object", put_object)


def foreign_record(store, **changes) -> LeaseRecord:
    """A lease as another job would have written it, by default on another host and far from expiry."""
    now = time.time()
    record = LeaseRecord(
        holder="job-elsewhere",
        token="t-elsewhere",
        host="some-other-host",
        pid=4242,
        acquired_at=now - 5,
        renewed_at=now - 5,
        expires_at=now + 600,
        ttl_s=600.0,
        boot_id="b",
        pid_namespace="pid:[1]",
        pid_started=1,
    )
    record = replace(record, **changes)
    store.put_json(KEY, record.to_doc())
    return record


def stored(store) -> LeaseRecord | None:
    doc = store.get_json(KEY)
    return None if doc is None else LeaseRecord.from_doc(doc, KEY)


# -- the backends' conditional create -----------------------------------------------------------


def test_put_if_absent_creates_once_and_never_overwrites(store):
    backend = store.backend

    assert backend.put_if_absent("a/b/LOCK", b"first") is True
    assert backend.put_if_absent("a/b/LOCK", b"second") is False

    assert backend.read("a/b/LOCK") == b"first"
    assert [i.key for i in backend.list("a/")] == ["a/b/LOCK"]  # no temporary files left behind


def test_put_if_absent_racing_threads_exactly_one_creates(store, atomic_moto):
    racers, start, created = 8, threading.Barrier(8), []

    def race(i):
        start.wait()
        if store.backend.put_if_absent("race/LOCK", f"racer-{i}".encode()):
            created.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(created) == 1
    assert store.backend.read("race/LOCK") == f"racer-{created[0]}".encode()


def test_file_put_if_absent_without_hard_links_uses_exclusive_create(tmp_path, monkeypatch):
    backend = open_store(f"file://{tmp_path}/store").backend

    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)

    assert backend.put_if_absent("x/LOCK", b"one") is True
    assert backend.put_if_absent("x/LOCK", b"two") is False
    assert backend.read("x/LOCK") == b"one"
    assert [p.name for p in (tmp_path / "store" / "x").iterdir()] == ["LOCK"]


@pytest.mark.parametrize("store", [MOTO], indirect=True)
def test_s3_without_conditional_puts_falls_back_to_check_write_and_read_back(store):
    client = store.backend._client
    real = client._put_object

    def no_conditions(bucket, name, data, headers=None, query_params=None):
        if headers and "If-None-Match" in headers:
            raise S3Error(urllib3.HTTPResponse(status=501), "NotImplemented", "injected", "/", "req", "host")
        return real(bucket, name, data, headers=headers, query_params=query_params)

    client._put_object = no_conditions

    assert store.backend.put_if_absent("x/LOCK", b"one") is True
    assert store.backend.put_if_absent("x/LOCK", b"two") is False
    assert store.backend.read("x/LOCK") == b"one"


@pytest.mark.parametrize("store", [MOTO], indirect=True)
def test_s3_create_whose_answer_was_lost_is_recognised_as_ours(store):
    client = store.backend._client
    real, calls = client._put_object, []

    def answer_lost_once(*args, **kwargs):
        calls.append(args[1])
        result = real(*args, **kwargs)
        if len(calls) == 1:
            raise urllib3.exceptions.ProtocolError("connection reset after the write")
        return result

    client._put_object = answer_lost_once

    assert store.backend.put_if_absent("x/LOCK", b"ours") is True  # the retry got 412, but the bytes are ours
    assert len(calls) == 2


# -- acquiring and releasing ---------------------------------------------------------------------


def test_acquire_writes_the_lease_and_release_deletes_it(store):
    with StageLease(store, KEY, holder="job-a", ttl_s=60) as lease:
        record = stored(store)
        assert lease.held and not lease.lost
        assert (record.holder, record.host, record.pid) == ("job-a", socket.gethostname(), os.getpid())
        assert record.expires_at == pytest.approx(record.acquired_at + 60)
        lease.check()
    assert stored(store) is None
    assert not lease.held
    with pytest.raises(StoreError, match="not held"):
        lease.check()


def test_default_holder_names_a_fresh_id_the_host_and_the_pid(store):
    a, b = StageLease(store, KEY), StageLease(store, KEY)
    assert a.holder != b.holder
    assert a.holder.endswith(f"@{socket.gethostname()}:{os.getpid()}")


def test_the_lease_is_released_when_the_block_raises(store):
    with pytest.raises(ValueError, match="boom"), StageLease(store, KEY):
        assert stored(store) is not None
        raise ValueError("boom")
    assert stored(store) is None


def test_a_second_acquirer_is_refused_with_who_holds_it_and_what_to_do(store):
    with StageLease(store, KEY, holder="job-a", ttl_s=60) as first:
        before = stored(store)
        second = StageLease(store, KEY, holder="job-b")
        with pytest.raises(LeaseHeld) as refused:
            second.acquire()
        message = str(refused.value)
        assert isinstance(refused.value, RingzeroError)
        assert store.backend.uri(KEY) in message
        assert f"held by job-a (host {socket.gethostname()}, pid {os.getpid()})" in message
        assert "taken 20" in message and "s ago)" in message
        assert "expires 20" in message and re.search(r"\(in (59|60) s\)", message)
        assert "wait for it to finish" in message and f"delete {store.backend.uri(KEY)}" in message
        assert (refused.value.holder, refused.value.pid) == ("job-a", os.getpid())

        second.release()  # never acquired: must leave the first one's lease alone
        assert stored(store) == before
        assert first.held


def test_a_lease_from_another_host_is_refused_however_dead_its_pid_looks(store):
    foreign_record(store, pid=999_999_999)
    with pytest.raises(LeaseHeld, match="held by job-elsewhere \\(host some-other-host, pid 999999999\\)"):
        StageLease(store, KEY).acquire()


@pytest.mark.parametrize("racers", [2, 8])
def test_threads_racing_to_acquire_exactly_one_wins(store, atomic_moto, racers):
    start, results = threading.Barrier(racers), []
    leases = [StageLease(store, KEY, holder=f"job-{i}", ttl_s=60) for i in range(racers)]

    def race(lease):
        start.wait()
        try:
            lease.acquire()
            results.append(("won", lease.holder))
        except LeaseHeld as exc:
            results.append(("refused", exc.holder))

    threads = [threading.Thread(target=race, args=(lease,)) for lease in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        winners = [h for outcome, h in results if outcome == "won"]
        assert len(results) == racers and len(winners) == 1
        assert all(h == winners[0] for outcome, h in results if outcome == "refused")
        assert stored(store).holder == winners[0]
    finally:
        for lease in leases:
            lease.release()
    assert stored(store) is None


CHILD = textwrap.dedent("""
    import faulthandler, json, os, signal, sys, types
    import structlog
    faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack when a child hangs
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout talks to the test
    spec = json.loads(sys.argv[1])
    from ringzero.store.lease import LeaseHeld, StageLease
    if spec["root"].startswith("s3://"):
        from ringzero.store.config import S3Settings
        from ringzero.store.credentials import credentials_from_env
        from ringzero.store.s3 import S3Backend
        bucket, _, prefix = spec["root"][len("s3://"):].partition("/")
        backend = S3Backend(bucket, prefix, S3Settings(endpoint=spec["endpoint"], **spec["retries"]),
                            credentials_from_env())
    else:
        from ringzero.store.local import LocalBackend
        backend = LocalBackend(spec["root"][len("file://"):])
    store = types.SimpleNamespace(backend=backend)  # all a lease needs of a store
    lease = StageLease(store, spec["key"], holder=spec["holder"], ttl_s=spec["ttl_s"])
    if spec["mode"] == "sigterm":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("ready", flush=True)
    sys.stdin.readline()
    if spec["mode"] == "race":
        try:
            lease.acquire()
            print("won", flush=True)
        except LeaseHeld:
            print("refused", flush=True)
        sys.stdin.readline()  # hold it until every racer has answered
        lease.release()
    elif spec["mode"] == "hold":
        lease.acquire()
        print("holding", flush=True)
        sys.stdin.readline()
    elif spec["mode"] == "sigterm":
        with lease:
            print("holding", flush=True)
            sys.stdin.readline()
""")


def child(store, mode: str, holder: str, ttl_s: float = 600.0) -> subprocess.Popen:
    spec = {
        **store.child_spec,
        "retries": FAST_RETRIES,
        "key": KEY,
        "mode": mode,
        "holder": holder,
        "ttl_s": ttl_s,
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        cwd=REPO,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout.readline().strip() == "ready", f"{holder} did not start (exit {proc.poll()})"
    return proc


def retry_budget_s() -> float:
    """The longest one store call of a child may take: every attempt waits out its timeout."""
    attempts = FAST_RETRIES["max_retries"] + 1
    return attempts * (FAST_RETRIES["timeout_s"] + FAST_RETRIES["backoff_max_s"])


def exit_status(proc: subprocess.Popen, store) -> int:
    """The child's exit status, waiting as long as a release (a read and a delete) may take with the
    child's retries. A child that outlives that is stuck: its stacks and the gateway's log say where."""
    try:
        return proc.wait(2 * retry_budget_s() + 10)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack to stderr (captured below)
        time.sleep(1)
        proc.kill()
        proc.wait()
        gateway_log = ""
        if store.child_spec.get("endpoint") == os.environ.get("RINGZERO_RGW_ENDPOINT") and os.environ.get(
            "RINGZERO_RGW_DIR"
        ):
            logs = sorted(Path(os.environ["RINGZERO_RGW_DIR"], "log").glob("client.rgw*.log"))
            gateway_log = "\n".join(logs[-1].read_text(errors="replace").splitlines()[-40:]) if logs else ""
        pytest.fail(
            "the child did not exit (its stacks are in the captured stderr); gateway log "
            f"tail:\n{gateway_log}"
        )


def say(proc: subprocess.Popen, line: str = "go") -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def test_processes_racing_to_acquire_exactly_one_wins(store, atomic_moto):
    procs = [child(store, "race", f"proc-{i}") for i in range(4)]
    try:
        for p in procs:
            say(p)
        outcomes = [p.stdout.readline().strip() for p in procs]
        assert sorted(outcomes) == ["refused"] * 3 + ["won"]
        assert stored(store).holder == f"proc-{outcomes.index('won')}"
        for p in procs:
            say(p, "release")
        assert [p.wait(60) for p in procs] == [0] * 4
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert stored(store) is None


# -- stale leases ---------------------------------------------------------------------------------


def test_an_expired_lease_is_taken_over(store):
    foreign_record(store, expires_at=time.time() - 1)

    with StageLease(store, KEY, holder="job-new", ttl_s=60):
        assert stored(store).holder == "job-new"


def test_a_holder_that_stopped_renewing_loses_its_lease_and_release_keeps_the_new_one(store):
    old = StageLease(store, KEY, holder="job-old", ttl_s=0.4, heartbeat_s=0.1).acquire()
    old._stop_heartbeat()  # a job frozen (or partitioned away) past its TTL
    time.sleep(0.6)

    new = StageLease(store, KEY, holder="job-new", ttl_s=60).acquire()
    try:
        assert old.renew() is False
        assert old.lost and "taken by job-new" in old.lost_reason
        with pytest.raises(LeaseLost, match="taken by job-new"):
            old.check()
        old.release()
        assert stored(store).holder == "job-new"
    finally:
        new.release()


def test_a_lease_whose_process_on_this_host_is_gone_is_taken_over_at_once(store):
    holder = child(store, "hold", "job-killed")
    try:
        say(holder)
        assert holder.stdout.readline().strip() == "holding"
        assert stored(store).holder == "job-killed"
        with pytest.raises(LeaseHeld, match="held by job-killed"):
            StageLease(store, KEY).acquire()  # alive: refused
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    record = stored(store)
    assert record.holder == "job-killed" and record.expires_at > time.time() + 500  # far from expiry
    with StageLease(store, KEY, holder="job-rerun"):
        assert stored(store).holder == "job-rerun"


def test_a_lease_whose_pid_was_reused_by_another_process_is_taken_over(store):
    mine = StageLease(store, KEY)._identity
    foreign_record(
        store,
        host=mine["host"],
        boot_id=mine["boot_id"],
        pid_namespace=mine["pid_namespace"],
        pid=os.getpid(),
        pid_started=mine["pid_started"] + 1,
    )
    with StageLease(store, KEY, holder="job-new"):
        assert stored(store).holder == "job-new"


def test_sigterm_turned_into_system_exit_releases_the_lease(store):
    holder = child(store, "sigterm", "job-terminated")
    try:
        say(holder)
        assert holder.stdout.readline().strip() == "holding"
        assert stored(store).holder == "job-terminated"
        holder.send_signal(signal.SIGTERM)
        assert exit_status(holder, store) == 143
    finally:
        holder.kill()
        holder.wait()
    assert stored(store) is None


# -- heartbeat and ownership ----------------------------------------------------------------------


def test_the_heartbeat_keeps_the_lease_past_its_ttl(store):
    with StageLease(store, KEY, holder="job-long", ttl_s=0.8, heartbeat_s=0.1) as lease:
        time.sleep(2.0)
        record = stored(store)
        assert record.renewed_at > record.acquired_at + 1.0
        assert record.expires_at > time.time()
        with pytest.raises(LeaseHeld, match="held by job-long"):
            StageLease(store, KEY).acquire()
        assert not lease.lost
        lease.check()


def test_the_heartbeat_reports_a_lease_taken_by_someone_else(store):
    with StageLease(store, KEY, holder="job-a", ttl_s=3.0, heartbeat_s=0.1) as lease:
        foreign_record(store)  # e.g. an operator deleted it and another job took it
        deadline = time.monotonic() + 20
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.lost and "taken by job-elsewhere (host some-other-host, pid 4242)" in lease.lost_reason
        with pytest.raises(LeaseLost):
            lease.check()
    assert stored(store).holder == "job-elsewhere"  # leaving the block did not delete the other's lease


def test_release_deletes_only_its_own_lease(store):
    lease = StageLease(store, KEY, holder="job-a", ttl_s=60).acquire()
    other = foreign_record(store)

    lease.release()

    assert stored(store) == other


def test_acquire_twice_is_the_same_hold_and_a_released_lease_can_be_taken_again(store):
    lease = StageLease(store, KEY, ttl_s=60)
    assert lease.acquire() is lease
    token = stored(store).token
    assert lease.acquire() is lease and stored(store).token == token
    lease.release()
    lease.release()  # twice is harmless
    with lease:
        assert stored(store).token == token
    assert stored(store) is None


def test_bad_parameters_are_refused(store):
    with pytest.raises(StoreError, match="ttl_s must be positive"):
        StageLease(store, KEY, ttl_s=0)
    with pytest.raises(StoreError, match="heartbeat_s must be positive and below ttl_s"):
        StageLease(store, KEY, ttl_s=10, heartbeat_s=10)
    with pytest.raises(StoreError, match="reserved for checkpoint markers"):
        StageLease(store, "runs/r1/COMMITTED")
    with pytest.raises(StoreError, match="segment"):
        StageLease(store, "../escape")


def test_a_key_holding_something_else_is_not_mistaken_for_a_lease(store):
    store.put_json(KEY, {"not": "a lease"})
    with pytest.raises(StoreError, match="is not a stage lease"):
        StageLease(store, KEY).acquire()
