"""Would two half-batches on two threads use a second core better than one batch at two threads?

The model of ``configs/tiny-cpu.yaml`` (fp32, random weights, as ``bench/serve_throughput.py``), 64 prompts
of 16 tokens, 128 new tokens each, ``ignore_eos``: one ``EmbeddedEngine`` over the whole batch at 1 and
2 intra-op threads, against two engines over the same model, each decoding 32 rows on its own Python thread
with one intra-op thread. Medians of interleaved runs after a warm-up.

    python bench/half_batches.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_throughput import shipped_model  # noqa: E402

from ringzero.rollout.engine.embedded import EmbeddedEngine  # noqa: E402
from ringzero.rollout.types import GenerateRequest, SamplingParams  # noqa: E402

BATCH, PROMPT, NEW = 64, 16, 128


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    model = shipped_model(PROMPT + NEW)
    prompts = torch.randint(3, model.cfg.vocab_size, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    reqs = [GenerateRequest(row, SamplingParams(max_new_tokens=NEW, seed=i, ignore_eos=True))
            for i, row in enumerate(prompts.tolist())]
    whole = EmbeddedEngine(model, None, model.policy, max_batch=BATCH)
    halves = [EmbeddedEngine(model, None, model.policy, max_batch=BATCH // 2) for _ in range(2)]

    def one(threads: int) -> None:
        torch.set_num_threads(threads)
        whole.generate(reqs)

    def two() -> None:
        def run(engine, part):
            torch.set_num_threads(1)
            engine.generate(part)
        half = BATCH // 2
        workers = [threading.Thread(target=run, args=(halves[i], reqs[i * half:(i + 1) * half])) for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    runs = {"one batch of 64, 1 thread": lambda: one(1), "one batch of 64, 2 threads": lambda: one(2),
            "two batches of 32 on two threads, 1 thread each": two}
    for fn in runs.values():
        fn()
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    print("| decoding | tokens/s |\n|---|---:|")
    for name, s in seconds.items():
        print(f"| {name} | {BATCH * NEW / statistics.median(s):,.0f} |")


if __name__ == "__main__":
    main()
