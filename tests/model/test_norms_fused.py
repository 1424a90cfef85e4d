"""``rms_norm`` at the compute precision takes torch's fused kernel: same numbers as the written-out form."""

import pytest
import torch

from ringzero.model.norms import rms_norm
from ringzero.model.tolerances import tolerance


def written_out(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(64, 1, 128), (32, 191, 128), (4, 80, 4, 32), (3, 5, 7)])
def test_fused_matches_written_out(dtype, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=dtype) * 3
    w = torch.randn(shape[-1], generator=g, dtype=dtype)
    assert torch.equal(rms_norm(x, w, 1e-6), written_out(x, w, 1e-6))
    w_grouped = torch.randn(shape[-2:], generator=g, dtype=dtype)  # GroupRMSNorm's per-group weight
    assert torch.equal(rms_norm(x, w_grouped, 1e-6), written_out(x, w_grouped, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_gradients_match(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 33, 64, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(64, generator=g, dtype=dtype, requires_grad=True)
    up = torch.randn(8, 33, 64, generator=g, dtype=dtype)
    gx, gw = torch.autograd.grad((rms_norm(x, w, 1e-6) * up).sum(), (x, w))
    rx, rw = torch.autograd.grad((written_out(x, w, 1e-6) * up).sum(), (x, w))
    tol = tolerance(dtype)
    torch.testing.assert_close(gx, rx, atol=tol.atol, rtol=tol.rtol)
    torch.testing.assert_close(gw, rw, atol=tol.atol, rtol=tol.rtol)


def test_bf16_input_keeps_the_fp32_island():
    x = torch.randn(4, 16, 64).bfloat16()
    w = torch.ones(64)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, written_out(x.float(), w, 1e-6).bfloat16())
