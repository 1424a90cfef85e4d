"""Store fixtures: file:// stores in tmp folders, and s3:// stores on moto (in this process) and on
the Ceph RADOS Gateway (started outside pytest by tests/servers/rgw-start.sh).

Each pytest process has its own moto server, so a test that kills it disturbs no other process.
The gateway is shared by all processes: tests hold a shared lock on it, and tests marked
``kills_server`` an exclusive one. (The ``xdist_group`` marks would keep them on one worker, but
``--dist loadgroup`` does not group anything under pytest 9.2, so the lock is what protects them.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from ci_require import require_tool
from store_kit import GatewayTarget, MotoTarget, S3Target

from ringzero.store import CheckpointStore, open_store
from ringzero.store.credentials import ACCESS_KEY_ENV, SECRET_KEY_ENV


def pytest_configure(config):
    # pytest-xdist registers this marker itself; without xdist (-p no:xdist) --strict-markers needs it here.
    config.addinivalue_line(
        "markers", "xdist_group(name): run on the same xdist worker as the group's other tests"
    )
    config.addinivalue_line("markers", "kills_server: stops the S3 server mid-test; needs it to itself")


MOTO = pytest.param("moto", marks=[pytest.mark.s3, pytest.mark.xdist_group("store-moto")], id="moto")
RGW = pytest.param(
    "rgw", marks=[pytest.mark.s3, pytest.mark.rgw, pytest.mark.xdist_group("store-rgw")], id="rgw"
)


@pytest.fixture(scope="session")
def moto_target() -> MotoTarget:
    return MotoTarget()


@pytest.fixture(scope="session")
def rgw_server() -> GatewayTarget:
    error = os.environ.get("RINGZERO_RGW_ERROR")
    if error:
        pytest.fail(f"tests/servers/rgw-start.sh failed: {error}")
    names = [
        "RINGZERO_RGW_ENDPOINT",
        "RINGZERO_RGW_ACCESS_KEY",
        "RINGZERO_RGW_SECRET_KEY",
        "RINGZERO_RGW_DIR",
    ]
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        require_tool(
            "Ceph RADOS Gateway", f"{missing[0]} unset (make test starts one with tests/servers/rgw-start.sh)"
        )
    return GatewayTarget(*(os.environ[n] for n in names))


@pytest.fixture
def rgw_target(rgw_server, request) -> Iterator[GatewayTarget]:
    """The gateway, locked for this test: exclusively if the test kills it, shared otherwise."""
    with rgw_server.locked(exclusive=request.node.get_closest_marker("kills_server") is not None):
        yield rgw_server


@pytest.fixture(params=[MOTO, RGW])
def s3_target(request) -> S3Target:
    return request.getfixturevalue(f"{request.param}_target")


@pytest.fixture
def s3_env(s3_target, monkeypatch) -> S3Target:
    """The target, with its credentials in the environment variables the store reads."""
    for var in (ACCESS_KEY_ENV, SECRET_KEY_ENV):
        monkeypatch.delenv(f"{var}_FILE", raising=False)
    monkeypatch.setenv(ACCESS_KEY_ENV, s3_target.access_key)
    monkeypatch.setenv(SECRET_KEY_ENV, s3_target.secret_key)
    return s3_target


@pytest.fixture
def s3_store(s3_env) -> CheckpointStore:
    """A store under a prefix of a fresh bucket, with 12 MiB shards so big_state_dict spans two."""
    return open_store(
        f"s3://{s3_env.new_bucket()}/ckpts", s3_env.settings(), max_shard_bytes=12 * 1024 * 1024
    )


@pytest.fixture
def file_store(tmp_path) -> CheckpointStore:
    return open_store(f"file://{tmp_path}/store", max_shard_bytes=1024)


@pytest.fixture(params=["file", MOTO])
def any_store(request, tmp_path, monkeypatch) -> CheckpointStore:
    """A file:// store and a moto-backed s3:// store: for behaviour that must not depend on the backend."""
    if request.param == "file":
        return open_store(f"file://{tmp_path}/store", max_shard_bytes=1024)
    target = request.getfixturevalue("moto_target")
    monkeypatch.setenv(ACCESS_KEY_ENV, target.access_key)
    monkeypatch.setenv(SECRET_KEY_ENV, target.secret_key)
    return open_store(f"s3://{target.new_bucket()}/ckpts", target.settings(), max_shard_bytes=1024)
