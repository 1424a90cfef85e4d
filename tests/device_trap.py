"""``device_trap``: fail on any host tensor inside a code path that must live on one device.

    from device_trap import device_trap

    model = model.to("meta")                      # or "cuda" where there is one
    with device_trap(torch.device("meta")) as trap:
        engine.generate(requests)                 # or one RL training step
    assert len(trap.host_reads) <= steps + 2      # reads are allowed, and counted

API
---
``device_trap(device: torch.device, allow_host_reads: bool = True)`` is a context manager yielding a
``TrapLog``. Inside it every torch call made from Python (torch functions and factories, ``Tensor``
methods and operators, ``torch.nn.functional``) is checked, and an ``AssertionError`` naming the op
(``torch.zeros``, ``torch.Tensor.add``, ...) is raised when

- the call returns a tensor that is not on ``device``: a tensor created on the host (``torch.zeros(n)``
  without ``device=``, ``torch.tensor(data)``, ``torch.arange(n)``) or moved there (``.cpu()``,
  ``.to("cpu")``);
- an argument is a tensor, or a ``torch.Generator``, that is not on ``device``: a host tensor made
  before the trap used together with device tensors, or a CPU generator drawing device numbers;
- ``allow_host_reads`` is False and the call reads a device tensor back to the host.

A call that names another device (``device="cpu"``, ``.to("cpu")``, ``.cpu()``) fails before it runs.

Allowed: Python data copied to the device (``torch.tensor(rows, device=device)``), metadata (shape,
dtype, device) and, with ``allow_host_reads``, the host reads of device tensors ``.tolist()``,
``.item()``, ``.numpy()``, ``bool()``, ``int()``, ``float()``, ``repr()``. Each read is appended to
``TrapLog.host_reads`` (op names in call order), so a test can bound the syncs, e.g. one per decode
step. ``TrapLog.ops`` counts every checked call by name (proof that a path really ran); a violation
that the code under test swallowed (``except Exception``) is still raised when the block exits.

Without a GPU, run the path on the ``meta`` device: its tensors have shapes and dtypes but no data, so
no kernel runs and any host tensor that meets a device one is a mismatch the trap sees. Two stand-ins
exist on ``meta`` only: host reads return zeros of the tensor's shape and dtype (``False`` for bool),
so code branching on them takes its "nothing happened" path (no stop sampled, no row finished early);
and ``torch.Generator(device="meta")``, which torch refuses, returns a CPU generator that the trap
counts as being on ``meta``. On a real device (``cuda``) reads return the real values and generators
are real ones.

Scope: the trap is a ``torch.overrides.TorchFunctionMode``, active in the calling thread only. It sees
the calls Python code makes, not what torch does inside one call (``torch.tensor(rows, device="cuda")``
stages its data on the host internally, which is the upload it asked for).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._pytree import tree_flatten

_REAL_GENERATOR = torch.Generator

HOST_READS = frozenset(
    {
        "tolist",
        "item",
        "numpy",
        "__array__",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "__repr__",
        "__str__",
        "__format__",
    }
)
"""``Tensor`` methods that copy values to the host and return Python (or numpy) values."""

_NEEDS_DATA = HOST_READS - {"__repr__", "__str__", "__format__"}  # meta can print itself, not read itself


@dataclass
class TrapLog:
    """What the trap saw: host reads in order, and a count of every checked call by op name."""

    device: torch.device
    host_reads: list[str] = field(default_factory=list)
    ops: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)


def _name(func) -> str:
    return resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)


def _on(actual: torch.device, wanted: torch.device) -> bool:
    """``wanted`` without an index (``cuda``) accepts any index of its type."""
    return actual.type == wanted.type and (wanted.index is None or actual.index in (None, wanted.index))


class _Trap(TorchFunctionMode):
    def __init__(self, log: TrapLog, allow_host_reads: bool, stand_ins: dict[int, torch.Generator]):
        super().__init__()
        self.log, self.allow_host_reads, self.stand_ins = log, allow_host_reads, stand_ins

    def _fail(self, message: str):
        self.log.violations.append(message)
        raise AssertionError(message)

    def _check_inputs(self, op: str, leaves) -> None:
        device = self.log.device
        for x in leaves:
            if isinstance(x, torch.Tensor) and not _on(x.device, device):
                self._fail(
                    f"device_trap({device}): {op} uses a tensor on {x.device} "
                    f"(shape {list(x.shape)}, {x.dtype}) inside a {device} path"
                )
            if isinstance(x, _REAL_GENERATOR) and id(x) not in self.stand_ins and not _on(x.device, device):
                self._fail(f"device_trap({device}): {op} draws with a generator on {x.device}")

    def _check_target(self, op: str, short: str, args, kwargs) -> None:
        """A call that names another device fails before it runs (a copy out of meta would not run)."""
        device = self.log.device
        if short == "cpu" and device.type != "cpu":
            target = torch.device("cpu")
        elif short == "to" and args and isinstance(args[0], torch.Tensor):
            target = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
        else:
            target = kwargs.get("device")
        if target is not None and not _on(torch.device(target), device):
            self._fail(
                f"device_trap({device}): {op} made a tensor on {torch.device(target)} inside a {device} path"
            )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The mode is off while this runs: torch calls made here are not checked.
        kwargs = kwargs or {}
        op = _name(func)
        self.log.ops[op] += 1
        leaves, _ = tree_flatten((args, kwargs))
        self._check_inputs(op, leaves)
        short = op.rsplit(".", 1)[-1]
        self._check_target(op, short, args, kwargs)
        if short in HOST_READS and args and isinstance(args[0], torch.Tensor):
            if not self.allow_host_reads:
                self._fail(
                    f"device_trap({self.log.device}): {op} reads a {self.log.device} tensor back to "
                    f"the host (allow_host_reads=False)"
                )
            self.log.host_reads.append(op)
            if args[0].device.type == "meta" and short in _NEEDS_DATA:
                stand_in = torch.zeros(args[0].shape, dtype=args[0].dtype)
                return func(stand_in, *args[1:], **kwargs)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        for x in tree_flatten(out)[0]:
            if isinstance(x, torch.Tensor) and not _on(x.device, self.log.device):
                self._fail(
                    f"device_trap({self.log.device}): {op} made a tensor on {x.device} "
                    f"(shape {list(x.shape)}, {x.dtype}) inside a {self.log.device} path"
                )
        return out


@contextlib.contextmanager
def _meta_generators(stand_ins: dict[int, torch.Generator]) -> Iterator[None]:
    """``torch.Generator(device="meta")`` -> a CPU generator registered as a stand-in for meta."""

    class Generator(_REAL_GENERATOR):  # a class still, for annotations such as ``torch.Generator | None``
        def __new__(cls, device="cpu"):
            if torch.device(device).type != "meta":
                return _REAL_GENERATOR(device)
            g = _REAL_GENERATOR()
            stand_ins[id(g)] = g  # kept alive, so its id is not reused while the trap runs
            return g

    torch.Generator = Generator
    try:
        yield
    finally:
        torch.Generator = _REAL_GENERATOR


@contextlib.contextmanager
def device_trap(device: torch.device | str, allow_host_reads: bool = True) -> Iterator[TrapLog]:
    """Raise ``AssertionError`` naming the op when a tensor off ``device`` is made or used (see module
    doc)."""
    log = TrapLog(torch.device(device))
    stand_ins: dict[int, torch.Generator] = {}
    with contextlib.ExitStack() as stack:
        if log.device.type == "meta":
            stack.enter_context(_meta_generators(stand_ins))
        stack.enter_context(_Trap(log, allow_host_reads, stand_ins))
        yield log
    if log.violations:  # raised inside, then caught by the code under test
        raise AssertionError(f"{len(log.violations)} device violation(s), first: {log.violations[0]}")
