"""Helpers for the store tests: loopback S3 servers that can be killed and restarted, a backend
that "crashes" at a chosen write, and bit-exact tensor comparison."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from minio import Minio

from ringzero.store.config import S3Settings

# Fast retries so that a dead server fails a test in well under a second.
FAST_RETRIES = {
    "max_retries": 2,
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
    "timeout_s": 20.0,
    "part_size_mb": 5,
}
MiB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Target:
    """One S3-compatible server the tests can reach, kill and bring back."""

    kind: str  # "moto" or "rgw"
    endpoint: str
    access_key: str
    secret_key: str

    def client(self) -> Minio:
        return Minio(self.endpoint, self.access_key, self.secret_key, secure=False)

    def new_bucket(self) -> str:
        name = f"ringzero-test-{uuid.uuid4().hex[:12]}"
        self.client().make_bucket(name)
        return name

    def settings(self, **overrides) -> S3Settings:
        return S3Settings(**{"endpoint": self.endpoint, **FAST_RETRIES, **overrides})

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError


class MotoTarget(S3Target):
    """moto's S3 server on a thread of this process. Its data lives in this process, so it survives
    a kill and restart of the server, like a real server's disks do."""

    def __init__(self):
        super().__init__("moto", "", "moto-test-access", "moto-test-secret")
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._server = None
        self.restart()

    def kill(self) -> None:
        inner = self._server._server
        self._server.stop()
        # stop() only leaves the serve loop; closing the socket makes new connections fail at once
        # instead of waiting in the listen backlog, as they would with a dead server.
        inner.server_close()

    def restart(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()


class GatewayTarget(S3Target):
    """The Ceph RADOS Gateway started by tests/servers/rgw-start.sh; killing it keeps the OSD's data."""

    def __init__(self, endpoint: str, access_key: str, secret_key: str, state_dir: str):
        super().__init__("rgw", endpoint, access_key, secret_key)
        self.state_dir = Path(state_dir)

    @contextmanager
    def locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the gateway against other test processes: shared to use it, exclusive to kill it."""
        with open(self.state_dir / "tests.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def kill(self) -> None:
        pid = int((self.state_dir / "run" / "client.rgw.ringzero.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def restart(self) -> None:
        subprocess.run(
            [str(self.state_dir / "restart-rgw")],
            check=True,
            timeout=120,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )


class SimulatedCrash(Exception):
    """Stands for the writing process dying at this point."""


class CrashingBackend:
    """Passes everything to ``inner``, recording the keys written, but raises ``SimulatedCrash``
    instead of performing write number ``at`` (never, if ``at`` is None)."""

    def __init__(self, inner, at: int | None = None):
        self.inner, self.at, self.written = inner, at, []

    def write(self, key, data, on_bytes=None):
        if len(self.written) + 1 == self.at:
            raise SimulatedCrash(key)
        self.inner.write(key, data, on_bytes)
        self.written.append(key)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_bit_exact(loaded: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    """Same names in the same order, and each tensor with the same dtype, shape and bytes (NaNs included)."""
    assert list(loaded) == list(saved)
    for name, want in saved.items():
        got = loaded[name]
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape)), name
        assert raw_bytes(got) == raw_bytes(want), name


def big_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """About 21.5 MiB: with 12 MiB shards and 5 MiB parts, two shards of three parts each."""
    g = torch.Generator().manual_seed(seed)
    return {
        "layers.0.w": torch.randn(11 * MiB // 4 + 3, generator=g),  # 11 MiB of fp32: shard 0
        "layers.1.w": torch.randn(5 * MiB // 2, generator=g)
        .to(torch.bfloat16)
        .reshape(1024, -1),  # 5 MiB: shard 1
        "layers.1.b": torch.randn(3 * MiB // 4, generator=g).to(torch.float16),  # 1.5 MiB
        "layers.2.w": torch.randn(MiB, generator=g),  # 4 MiB
        "step": torch.tensor(7),
    }
