"""Torch's vector math (MKL's VML behind ``cos``, ``exp`` and friends), initialised before real work.

Seen on two threads under load: a process's first parallel ``cos`` on fp64 came back with about 27
correct bits (errors of 7e-9 on values near 1) in exactly the half of the tensor the second OpenMP thread
computed, while ``sin`` right after it and every later call were exact. That is the accuracy of VML's
"enhanced performance" mode, so a thread ran its first call before the library had settled which
kernels it uses; it happened in roughly one fresh process in 20-60, never twice in one process. An fp64
reference that is silently fp32-accurate breaks every check that compares against it (``ringzero check
decode`` flipped between 5e-15 and 1.3e-8 from run to run).

``warm_up`` runs each VML-backed function the model uses once, on a tensor large enough that every
thread of the pool takes a share, and throws the results away: whatever a first call gets wrong is
then never read. It runs when this module is imported (the model modules import it) and again from
``set_threads``, since a larger pool starts threads that have made no call yet.
"""

from __future__ import annotations

import torch

_GRAIN = 2048  # elements per thread below which ATen's unary kernels stay on one thread
_WARMED_THREADS = 0


def _functions():
    return (
        torch.cos,
        torch.sin,
        torch.exp,
        torch.log,
        torch.sqrt,
        torch.rsqrt,
        torch.tanh,
        torch.expm1,
        torch.log1p,
        torch.erf,
        torch.sigmoid,
    )


def warm_up() -> None:
    """Call each function once per dtype with every thread of the current pool taking part."""
    global _WARMED_THREADS
    threads = torch.get_num_threads()
    if threads <= _WARMED_THREADS:
        return
    n = 2 * _GRAIN * threads
    for dtype in (torch.float64, torch.float32):
        x = torch.linspace(0.25, 0.75, n, dtype=dtype)
        for fn in _functions():
            fn(x)
    _WARMED_THREADS = threads


def set_threads(n: int) -> None:
    """``torch.set_num_threads(n)``, then warm the threads a larger pool adds."""
    torch.set_num_threads(n)
    warm_up()


warm_up()
