"""On a torch build without CUDA, megatron.core is imported with its torch.compile jit fuser off
(``ringzero.engines.megatron.eager_import``): no dynamo or inductor is loaded, and the router's expert-bias
token count, which every MoE training forward calls, runs eagerly instead of being compiled to C++. With CUDA
the fuser stays on. Each case runs in a fresh interpreter, since an import happens once per process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")

PROBE = """
import json, sys, warnings
warnings.simplefilter("ignore")
import torch

COMPILE = torch.compile

def compiled_functions():
    # every function of a loaded megatron module or class that torch.compile wrapped, by name
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.") or module is None:
            continue
        owners = [module] + [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == name]
        for owner in owners:
            for attr, value in vars(owner).items():
                wrapper = callable(value) and getattr(value, "_torchdynamo_wrapper_id", None) == id(value)
                if wrapper and not getattr(value, "_torchdynamo_disable", False):
                    found.append(f"{getattr(owner, '__name__', name)}.{attr}")
    return sorted(set(found))

def state():
    import megatron.core.extensions.transformer_engine as te_ext
    from megatron.core.transformer.moe.router import TopKRouter
    return {
        "dynamo": "torch._dynamo" in sys.modules,
        "inductor": "torch._inductor" in sys.modules,
        "compile_restored": torch.compile is COMPILE,
        "router_compiled": hasattr(TopKRouter.__dict__["_apply_expert_bias"], "_torchdynamo_orig_callable"),
        "compiled": compiled_functions(),
        "te_stand_in": [type(te_ext.te).__name__, id(te_ext.te)],
    }

states = {"cuda": torch.cuda.is_available()}
%s
print(json.dumps(states))
"""


def probe(steps: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE % steps], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got["cuda"]:
        pytest.skip("on a CUDA build megatron's fuser is meant to stay on")
    return got


def test_through_ringzero_nothing_is_compiled_and_inductor_never_loads():
    got = probe('import ringzero.engines.megatron.engine\nstates["cpu"] = state()')["cpu"]
    assert not got["dynamo"] and not got["inductor"]
    assert got["compiled"] == [] and not got["router_compiled"]
    assert got["compile_restored"]  # torch.compile itself is torch's again once megatron has imported


def test_with_cuda_the_fuser_stays_and_imported_before_ringzero_on_cpu_the_shim_undoes_it():
    """One interpreter: megatron imported as on a CUDA build (its fuser on, as it is whenever megatron.core
    is imported directly: the negative control), then the CPU shim applied as on a CPU build."""
    got = probe(
        "torch.cuda.is_available = lambda: True\n"
        "import ringzero.engines.megatron\n"
        'states["cuda_import"] = state()\n'
        "torch.cuda.is_available = lambda: False\n"
        "from ringzero.engines.megatron import cpu_shim\n"
        "cpu_shim.apply()\n"
        'states["after_shim"] = state()'
    )
    on, off = got["cuda_import"], got["after_shim"]
    assert on["dynamo"] and on["inductor"] and on["router_compiled"]
    assert "TopKRouter._apply_expert_bias" in on["compiled"] and len(on["compiled"]) > 10
    assert off["compiled"] == [] and not off["router_compiled"]
    # only compiled functions are put back: megatron's MagicMock stand-in for absent TE (which answers every
    # attribute, a compiled function's included) is the same object as before
    assert on["te_stand_in"] == off["te_stand_in"] and on["te_stand_in"][0] == "MagicMock"
