"""The patches megatron-core 0.16.1 needs to build and run ringzero's model without Transformer Engine,
and on a CPU torch build under gloo. ``apply()`` installs them once per process (idempotent); call it
after ``import megatron.core`` and before building a model.

Genuine 0.16.1 bugs without Transformer Engine (installed on GPU too):
- ``transformer/multi_latent_attention.py`` ``MLASelfAttention.__init__``: ``isinstance(self.linear_proj,
  TELinear)`` with ``HAVE_TE`` true, because ``extensions/transformer_engine.py`` builds ``TELinear`` on a
  ``MagicMock`` when TE is absent, so the import that sets ``HAVE_TE`` succeeds; the check raises
  ``TypeError``. Patched: ``HAVE_TE = False`` in that module when TE does not import.
- the same ``__init__`` passes ``k_channels``/``v_channels`` to its core attention, which the local
  spec's ``DotProductAttention`` does not accept (``TypeError``), and that class refuses context
  parallelism. Not a patch: ringzero's model puts its own core there (``attention.MLACoreAttention``).
- MLA's shared RoPE key at TP > 1 (NVIDIA/Megatron-LM#1699): ``linear_kv_down_proj`` is column-parallel,
  its output is gathered (backward: split), and ``k_pos_emb`` is expanded over this rank's heads only,
  so its gradient is never summed over TP: most rows of the RoPE part of ``linear_kv_down_proj``'s
  gradient are wrong. Patched: ``MLASelfAttention.get_query_key_value_tensors`` marks its forward, and
  the second ``apply_rotary_pos_emb`` call inside it (the key's; the first is the query's) goes through
  ``AllReduceGrad`` (identity forward, gradient summed over TP). Megatron's own
  ``copy_to_tensor_model_parallel_region`` cannot stand in: ``mappings._reduce`` all-reduces
  ``x.contiguous()`` and returns ``x``, which silently skips the sum for a strided gradient (this one,
  a slice of ``torch.cat``'s backward, is).
- ``transformer/moe/moe_utils.py`` ``RouterGatingLinearFunction``: reads ``te_general_gemm``, defined
  only when TE imports (``NameError`` on every MoE forward). Patched: the name set to ``None``.

CPU only (nothing of this is installed when CUDA is available):
- megatron's jit fuser (``torch.compile``), for a process that imported megatron.core before ringzero did:
  ``eager_import.eager_fused_functions()`` puts back the undecorated functions (why: ``eager_import``).
- ``torch.cuda.current_device()``, which megatron calls to place tensors (``RotaryEmbedding`` of MLA,
  built without ``use_cpu_initialization``, and its ``get_emb`` moving ``inv_freq``; the MoE router and
  experts): on a CPU build it raises. Patched: it returns the CPU device. This is the one patch of torch
  itself; ringzero never calls it without checking ``torch.cuda.is_available()`` first.
- ``models/common/embeddings/rope_utils.py`` ``get_pos_emb_on_this_cp_rank`` (MLA's RoPE under context
  parallelism): its chunk index is built in pinned memory and moved with ``.cuda()``. Patched in the
  module that calls it (``rotary_pos_embedding``): the same selection of chunks ``r`` and ``2 cp - 1 - r``
  on the embedding's device.
- ``tensor_parallel/random.py`` ``CudaRNGStatesTracker.add`` / ``fork`` (``model_parallel_cuda_manual_seed``
  and every dropout): ``torch.cuda.get_rng_state``. Patched: the tracker keeps CPU generator states, so
  per-TP-rank dropout seeds still work (the fork warns that the CPU state changed when a dropout with
  p > 0 draws: expected here).
Weights must be built with ``use_cpu_initialization=True`` on such a build (``MegatronLM`` sets it unless
it is given a CUDA device): the GPU path allocates on ``torch.cuda.current_device()``.

CPU only, for the pipeline schedule (``apply_pipeline()``, called by ``ringzero.engines.megatron.pipeline``):
``schedules.py``'s ``torch.zeros([], device="cuda")`` token count and ``p2p_communication.py``'s
``torch.cuda.synchronize``: both modules see the proxy of torch described below.

CPU only, and only for the distributed optimizer (``apply_optimizer()``, called by
``ringzero.engines.megatron.distributed_optimizer`` when CUDA is absent; nothing else uses megatron's DDP
buffers or optimizers):
- ``device='cuda'`` literals and ``torch.cuda.synchronize/empty_cache`` in ``optimizer/optimizer.py``
  (``MixedPrecisionOptimizer.__init__``: ``found_inf``, ``_dummy_overflow_buf``, ``_scale_one``;
  ``FP32Optimizer.__init__``), ``optimizer/clip_grads.py`` (``get_grad_norm_fp32``'s norm buffers,
  ``clip_grad_by_total_norm_fp32``'s overflow buffer, ``count_zeros_fp32``), ``optimizer/
  distrib_optimizer.py`` (state gathering buffers) and ``utils.py`` (``local_multi_tensor_l2_norm``, the
  l2 norm used without apex/TE). Patched: each of those four modules' global ``torch`` is a proxy of
  torch whose ``tensor/zeros/ones/empty/full/arange`` map a CUDA device to the CPU and whose ``cuda``
  has no-op ``synchronize``/``empty_cache``. torch itself is untouched.
- ``param.type() == 'torch.cuda.FloatTensor'`` (and the Half/BFloat16 names): ``distrib_optimizer.py``
  ``DistributedOptimizer.__init__`` and ``_build_model_and_main_param_groups`` sort parameters into
  fp32 and 16-bit groups by it (``TypeError`` on a CPU tensor), ``clip_grads.py``
  ``clip_grad_by_total_norm_fp32`` asserts it. A module proxy cannot reach a method of the tensor, so
  ``torch.Tensor.type`` is patched, but only while those two functions run (a context manager around
  them): there a CPU tensor names its CUDA type. Everywhere else ``Tensor.type`` is torch's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import types

import torch

from ringzero.engines.megatron.eager_import import eager_fused_functions

_APPLIED = False
_OPTIMIZER_APPLIED = False
_PIPELINE_APPLIED = False
# Inside MLASelfAttention.get_query_key_value_tensors: the count of apply_rotary_pos_emb calls so far.
_ROPE_CALLS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("mla_rope_calls", default=None)


class AllReduceGrad(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group`` (on a contiguous copy, see above)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _APPLIED = True
    _fix_te_absent()
    _fix_mla_rope_key_grad()
    if not torch.cuda.is_available():
        eager_fused_functions()
        _cpu_devices()
        _cpu_rng_tracker()


def _te_importable() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _fix_te_absent() -> None:
    if _te_importable():
        return
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.multi_latent_attention as mla

    mla.HAVE_TE = False
    moe_utils.te_general_gemm = None


def _fix_mla_rope_key_grad() -> None:
    import megatron.core.transformer.multi_latent_attention as mla
    from megatron.core import parallel_state

    original_rope = mla.apply_rotary_pos_emb
    original_qkv = mla.MLASelfAttention.get_query_key_value_tensors

    @functools.wraps(original_rope)
    def rope(t, *args, **kwargs):
        calls = _ROPE_CALLS.get()
        if calls is not None:
            calls[0] += 1
            if calls[0] == 2 and parallel_state.get_tensor_model_parallel_world_size() > 1:
                t = AllReduceGrad.apply(t, parallel_state.get_tensor_model_parallel_group())
        return original_rope(t, *args, **kwargs)

    @functools.wraps(original_qkv)
    def get_query_key_value_tensors(self, *args, **kwargs):
        token = _ROPE_CALLS.set([0])
        try:
            return original_qkv(self, *args, **kwargs)
        finally:
            _ROPE_CALLS.reset(token)

    mla.apply_rotary_pos_emb = rope
    mla.MLASelfAttention.get_query_key_value_tensors = get_query_key_value_tensors


def _cpu_devices() -> None:
    import megatron.core.models.common.embeddings.rotary_pos_embedding as rotary

    torch.cuda.current_device = lambda: torch.device("cpu")

    def pos_emb_on_this_cp_rank(pos_emb, seq_dim, cp_group):
        cp, rank = cp_group.size(), cp_group.rank()
        index = torch.tensor([rank, 2 * cp - rank - 1], device=pos_emb.device)
        chunks = pos_emb.view(*pos_emb.shape[:seq_dim], 2 * cp, -1, *pos_emb.shape[seq_dim + 1 :])
        mine = chunks.index_select(seq_dim, index)
        return mine.view(*mine.shape[:seq_dim], -1, *mine.shape[seq_dim + 2 :])

    rotary.get_pos_emb_on_this_cp_rank = pos_emb_on_this_cp_rank


def _cpu_rng_tracker() -> None:
    import megatron.core.tensor_parallel.random as random

    def add(self, name, seed):
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    random.CudaRNGStatesTracker.add = add
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)


def apply_optimizer() -> None:
    """The distributed optimizer's CPU patches (see the module docstring); idempotent, none with CUDA."""
    global _OPTIMIZER_APPLIED
    if _OPTIMIZER_APPLIED or torch.cuda.is_available():
        return
    _OPTIMIZER_APPLIED = True
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.distrib_optimizer as distrib_optimizer
    import megatron.core.optimizer.optimizer as optimizer
    import megatron.core.utils as utils

    proxy = _cpu_torch()
    for module in (optimizer, clip_grads, distrib_optimizer, utils):
        module.torch = proxy
    cls = distrib_optimizer.DistributedOptimizer
    cls.__init__ = _with_cuda_type_names(cls.__init__)
    build = cls._build_model_and_main_param_groups.__func__
    cls._build_model_and_main_param_groups = classmethod(_with_cuda_type_names(build))
    clipped = _with_cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clipped
    optimizer.clip_grad_by_total_norm_fp32 = clipped


def apply_pipeline() -> None:
    """The pipeline schedule's CPU patch: ``schedules.py`` counts tokens in ``torch.zeros(...,
    device="cuda")`` and ``p2p_communication.py`` may ``torch.cuda.synchronize()``; both modules see the CPU
    proxy of torch (the same as the optimizer modules'). Idempotent; nothing with CUDA."""
    global _PIPELINE_APPLIED
    if _PIPELINE_APPLIED or torch.cuda.is_available():
        return
    _PIPELINE_APPLIED = True
    import megatron.core.pipeline_parallel.p2p_communication as p2p
    import megatron.core.pipeline_parallel.schedules as schedules

    proxy = _cpu_torch()
    for module in (schedules, p2p):
        module.torch = proxy


def _on_cpu(device):
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _cpu_torch() -> types.ModuleType:
    """``torch`` as the megatron optimizer modules see it on a CPU build (see the module docstring)."""

    class CpuTorch(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch, name)

    class CpuCuda(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch.cuda, name)

    proxy, cuda = CpuTorch("torch"), CpuCuda("torch.cuda")
    cuda.synchronize = lambda *args, **kwargs: None
    cuda.empty_cache = lambda *args, **kwargs: None
    proxy.cuda = cuda

    def factory(make):
        @functools.wraps(make)
        def on_cpu(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _on_cpu(kwargs["device"])
            return make(*args, **kwargs)

        return on_cpu

    for name in ("tensor", "zeros", "ones", "empty", "full", "arange"):
        setattr(proxy, name, factory(getattr(torch, name)))
    return proxy


@contextlib.contextmanager
def _cuda_type_names():
    original = torch.Tensor.type
    if getattr(original, "_names_cuda", False):  # nested (``__init__`` calls the group builder)
        yield
        return

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and self.device.type == "cpu":
            return original(self).replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs) if dtype is not None else original(self)

    type_._names_cuda = True
    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = original


def _with_cuda_type_names(fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with _cuda_type_names():
            return fn(*args, **kwargs)

    return wrapped
