"""Fault points for ``tests/faults/fault_campaign.py``: on the PYTHONPATH of a run, this module (imported by
Python at startup) wraps the local store backend's writes so that the process dies at a chosen write.

``RINGZERO_FAULT=<point>:<k>`` acts at the k-th write of that point (1-based) in this process:
- ``shard:k``: the k-th safetensors shard is half written to its temporary file, then SIGKILL (a crash
  in the middle of a checkpoint save);
- ``commit:k``: SIGKILL just before the k-th ``COMMITTED`` marker (every shard and the manifest written);
- ``outcome:1``: SIGKILL just before the stage outcome document; ``outcome-after:1`` just after it;
- ``manifest:k``: SIGKILL just before the k-th write of the run manifest (``runs/<name>/manifest.json``);
- ``enospc:k``: the k-th shard write fails with ``ENOSPC`` half way (a full disk), the process lives on.
``RINGZERO_FAULT_COUNT=<path>``: count the writes of each point and write the counts to ``path`` as
JSON when the process exits normally (the reference run sizes ``k`` with it).
Nothing happens when neither variable is set, and nothing of this ships in the package.
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import signal


def _point_of(key: str) -> str | None:
    if key.endswith(".safetensors"):
        return "shard"
    if key.endswith("/COMMITTED"):
        return "commit"
    if key.endswith("/outcome.json"):
        return "outcome"
    if key.startswith("runs/") and key.endswith("/manifest.json"):
        return "manifest"
    return None


def _install() -> None:
    fault, count_path = os.environ.get("RINGZERO_FAULT"), os.environ.get("RINGZERO_FAULT_COUNT")
    if not fault and not count_path:
        return
    from ringzero.store import local

    counts: dict[str, int] = {}
    want, _, at = (fault or "").partition(":")
    at_k = int(at) if at else 1
    original_write, original_put = local.LocalBackend.write, local.LocalBackend.put_if_absent

    def hit(key: str) -> str | None:
        point = _point_of(key)
        if point is not None:
            counts[point] = counts.get(point, 0) + 1
        return point

    def write(self, key, data, on_bytes=None):
        point = hit(key)
        base = {"outcome-after": "outcome", "enospc": "shard"}.get(want, want)
        if point == base and counts.get(point) == at_k:
            if want == "shard":
                path = self.root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                local._durable_temp(path, data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            if want == "enospc":
                path = self.root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = local._durable_temp(path, data[: len(data) // 2])
                tmp.unlink()
                from ringzero.errors import StoreError

                raise StoreError(f"cannot write {self.uri(key)}: {os.strerror(errno.ENOSPC)}")
            if want in ("commit", "outcome", "manifest"):
                os.kill(os.getpid(), signal.SIGKILL)
        original_write(self, key, data, on_bytes)
        if want == "outcome-after" and point == "outcome" and counts.get(point) == at_k:
            os.kill(os.getpid(), signal.SIGKILL)

    def put_if_absent(self, key, data):
        point = hit(key)
        if want == point and counts.get(point) == at_k and want in ("commit", "outcome", "manifest"):
            os.kill(os.getpid(), signal.SIGKILL)
        return original_put(self, key, data)

    local.LocalBackend.write = write
    local.LocalBackend.put_if_absent = put_if_absent
    if count_path:
        atexit.register(lambda: open(count_path, "w").write(json.dumps(counts)))


_install()
