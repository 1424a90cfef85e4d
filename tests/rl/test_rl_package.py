"""``ringzero.rl`` stays light: importing it must not pull in torch (the CLI and configs import it)."""

import subprocess
import sys


def test_importing_the_rl_package_imports_no_torch():
    code = "import sys, ringzero.rl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
