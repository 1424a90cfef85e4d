"""Why the engine runs on the main thread: the cost of small parallel ops on a second thread.

Each thread that runs a parallel op owns an OpenMP team. With the main thread's team alive and a second
thread running ops too, the OpenMP threads outnumber 2 cores, libgomp throttles its spin-wait, and every
parallel region pays a wake-up. Three cases, each in a fresh process at ``--threads`` intra-op threads:

- ``main``: the ops on the main thread;
- ``second thread, main has a team``: the main thread ran the ops first, then a second thread runs them
  (``ringzero serve`` before: the model loaded on the main thread, the engine on a scheduler thread);
- ``second thread alone``: only the second thread ever runs parallel ops.

    python bench/omp_threads.py --threads 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASE = """
import json, sys, threading, time, torch
torch.set_num_threads(int(sys.argv[1]))
case = sys.argv[2]
a, w, x = torch.randn(64, 128), torch.randn(128, 352), torch.randn(64, 16, 128)
OPS = {"matmul 64x128 @ 128x352": lambda: a @ w, "softmax 64x16x128": lambda: torch.softmax(x, -1),
       "add 64x16x128": lambda: x + x, "silu 64x16x128": lambda: torch.nn.functional.silu(x)}
out = {}
def bench():
    for name, fn in OPS.items():
        for _ in range(200):
            fn()
        start = time.perf_counter()
        for _ in range(3000):
            fn()
        out[name] = (time.perf_counter() - start) / 3000 * 1e6
if case != "second thread alone":
    bench()
if case != "main":
    t = threading.Thread(target=bench)
    t.start()
    t.join()
print(json.dumps(out))
"""
CASES = ("main", "second thread, main has a team", "second thread alone")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    results = {case: json.loads(subprocess.run([sys.executable, "-c", CASE, str(args.threads), case],
                                               capture_output=True, text=True, check=True).stdout)
               for case in CASES}
    ops = list(results[CASES[0]])
    print(f"microseconds per op, {args.threads} intra-op threads, 3000 calls after 200 warm-up\n")
    print("| op | " + " | ".join(CASES) + " |")
    print("|---|" + "---:|" * len(CASES))
    for op in ops:
        print(f"| {op} | " + " | ".join(f"{results[c][op]:.1f}" for c in CASES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
