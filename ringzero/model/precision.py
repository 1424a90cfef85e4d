"""Runtime side of the precision policy: which torch dtype each part of the model computes in.

The policy itself (``PrecisionPolicy``) lives in ``config.py`` and has no torch import. The islands are
applied where they happen (attention softmax in ``attention.py``, LM head in ``hybrid.py``); these helpers
only name the dtypes so every island reads the same rule.
"""

from __future__ import annotations

import torch

from ringzero.model import vector_math  # noqa: F401  (initialises torch's vector math: see the module)
from ringzero.model.config import PrecisionPolicy

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16" | "float32" | "float64"`` -> the torch dtype."""
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise KeyError(f"no policy name for {dtype}")


def body_dtype(policy: PrecisionPolicy) -> torch.dtype:
    """Parameters and activations outside the islands."""
    return torch_dtype(policy.body)


def at_least_fp32(dtype: torch.dtype) -> torch.dtype:
    """The dtype an island computes in: fp32, or fp64 when the input already is (tests run fp64 bodies)."""
    return torch.promote_types(dtype, torch.float32)


def state_dtype(policy: PrecisionPolicy) -> torch.dtype:
    """Lightning recurrent state: always fp32, fp64 under an fp64 body."""
    return at_least_fp32(body_dtype(policy))


def logits_dtype(policy: PrecisionPolicy) -> torch.dtype:
    """Logits come out in fp32 under the LM-head island, else in the body dtype."""
    body = body_dtype(policy)
    return at_least_fp32(body) if policy.lm_head_fp32 else body
