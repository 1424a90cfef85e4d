"""One writer per key: every rank of a job runs the same stage code, and only rank 0 touches the store.

The weights are replicated on every rank (data parallelism sums gradients, context parallelism shards
only activations), so rank 0's copy *is* the job's state: it commits it, and the other ranks receive
what the write returned (a URI) once it is committed. A write that fails on rank 0 fails on every rank
with the same message, so no rank runs ahead.

Reads that decide what to do next (``list``, ``latest``, ``get_json``, ``get_bytes``) are answered by
rank 0 too: otherwise a slow rank could look after rank 0 had already written (``save_final`` finds
the checkpoint committed and skips the write its peers are waiting in). Every rank therefore calls
these methods in the same order, as it does every collective. Loading a checkpoint's tensors
(``load``) stays local to each rank: it decides nothing and its data is too large to broadcast.
"""

from __future__ import annotations

from typing import Any

from ringzero.errors import RingzeroError
from ringzero.parallel.runtime import Runtime

WRITES = ("save", "put_json", "put_bytes", "delete", "gc_uncommitted", "import_folder", "export_folder")
DECIDING_READS = ("list", "latest", "get_json", "get_bytes")


class OneWriterStore:
    """Wraps a ``CheckpointStore``; see the module docstring."""

    def __init__(self, store, runtime: Runtime):
        self._store, self._runtime = store, runtime

    @property
    def inner(self):
        return self._store

    @property
    def drops_writes(self) -> bool:
        """This rank's writes are rank 0's to make: it may pass empty tensors (``master_state_dict(everywhere=
        False)`` gives it none)."""
        return self._runtime.distributed and not self._runtime.is_main

    def __getattr__(self, name: str):
        value = getattr(self._store, name)
        if name not in WRITES + DECIDING_READS or not self._runtime.distributed:
            return value
        return lambda *args, **kwargs: self._on_rank0(name, value, args, kwargs)

    def _on_rank0(self, name: str, method, args, kwargs) -> Any:
        outcome: tuple[bool, Any] = (True, None)
        if self._runtime.is_main:
            try:
                outcome = (True, method(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - every rank must learn that the write failed
                outcome = (False, f"{type(exc).__name__}: {exc}")
                shared = self._runtime.broadcast(outcome)
                raise
        shared = self._runtime.broadcast(outcome)
        ok, value = shared
        if not ok:
            raise RingzeroError(f"store.{name} failed on rank 0: {value}")
        return value


def writes_on_rank0(store) -> bool:
    """Whether only rank 0's tensors reach ``store`` (the same answer on every rank of a job): then the full
    weights of a write need gathering to rank 0 only (``master_state_dict(everywhere=False)``)."""
    return isinstance(store, OneWriterStore)


def one_writer(store, runtime: Runtime):
    """``store`` itself for a single process, else the rank-0-writes wrapper."""
    return (
        store
        if not runtime.distributed or isinstance(store, OneWriterStore)
        else OneWriterStore(store, runtime)
    )
