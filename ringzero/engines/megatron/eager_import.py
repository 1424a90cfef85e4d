"""megatron-core on a torch build without CUDA, with its jit fuser off.

When ``megatron.core`` is imported, ``megatron/core/jit.py`` binds ``jit_fuser = torch.compile``, and some
30 functions are decorated with it right away: fused activations, norms, ``TopKRouter._apply_expert_bias``.
Without CUDA this costs twice:
- the import loads torch._dynamo and torch._inductor, 1.5-2.4 s of every process that imports megatron
  (measured on this project's CPU machines: 4.7-5.5 s against 3.1-3.4 s for the engine's imports);
- ringzero's model calls one of those functions. It is the router's count of tokens per expert, run in every
  training forward of a MoE layer with ``moe_router_enable_expert_bias``. Inductor compiles it into C++, so
  the host needs a C++ compiler, and each process spends seconds compiling a sum. Eager, the sum gives the
  same counts.

``import_megatron_core()`` imports megatron.core with ``torch.compile`` replaced, for the length of the
import, by megatron's own ``noop_decorator`` semantics. It then leaves ``jit_fuser`` at megatron's no-op
(``disable_jit_fuser()``), so functions decorated later are not compiled either. With CUDA it only imports:
there megatron's fuser builds Triton kernels, as Megatron users expect.

``eager_fused_functions()`` covers a process that imported megatron.core before ringzero did. In the megatron
modules already loaded, it puts back the undecorated function of every compiled one, and it points each
module's ``jit_fuser`` at the no-op. ``cpu_shim.apply()`` calls it on a CPU build.
"""

from __future__ import annotations

import inspect
import sys

import torch


def _noop_compile(model=None, **_options):
    """``torch.compile``'s two call forms, ``torch.compile(fn)`` and ``torch.compile(**options)(fn)``,
    returning ``fn`` itself."""
    return model if model is not None else (lambda fn: fn)


def import_megatron_core() -> bool:
    """Imports megatron.core, with the jit fuser off on a build without CUDA. Returns False, and imports
    nothing, when megatron-core is not installed; any other import error is raised."""
    if "megatron.core" in sys.modules or torch.cuda.is_available():
        return _import()
    compile_ = torch.compile
    torch.compile = _noop_compile
    try:
        if not _import():
            return False
    finally:
        torch.compile = compile_
    import megatron.core.jit as jit

    jit.disable_jit_fuser()
    return True


def _import() -> bool:
    try:
        import megatron.core  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name in ("megatron", "megatron.core"):
            return False
        raise
    return True


def eager_fused_functions() -> int:
    """Undoes the jit fuser in the megatron modules already loaded. Returns how many compiled functions it
    put back."""
    import megatron.core.jit as jit

    jit.disable_jit_fuser()
    restored = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.") or module is None:
            continue
        if getattr(module, "jit_fuser", None) is torch.compile:
            module.jit_fuser = jit.noop_decorator
        owners = [module] + [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name]
        for owner in owners:
            for attr, value in list(vars(owner).items()):
                if _compiled(value):
                    setattr(owner, attr, value._torchdynamo_orig_callable)
                    restored += 1
    return restored


def _compiled(value) -> bool:
    """A function torch.compile wrapped: not a MagicMock (megatron stands them in for absent TE and
    Triton, and a mock has every attribute), not a ``torch.compiler.disable`` wrapper (which carries the
    same ``_torchdynamo_orig_callable``), not a ``functools.wraps`` copy of either (whose wrapper id is
    another object's)."""
    return (
        inspect.isfunction(value)
        and inspect.isfunction(getattr(value, "_torchdynamo_orig_callable", None))
        and getattr(value, "_torchdynamo_wrapper_id", None) == id(value)
        and not getattr(value, "_torchdynamo_disable", False)
    )
