"""Serving under concurrent clients: continuous vs static batching, side by side in one run.

The server (``RolloutServer`` over ``EmbeddedEngine``) runs on a thread of this process with the model of
configs/tiny-cpu.yaml under random weights, fp32. For each client count, ``N`` closed-loop clients each
send their share of one fixed list of requests (each the next as soon as the last is answered) of mixed
prompt and output lengths (``ignore_eos``, so every request decodes exactly its ``max_new_tokens``), over
HTTP to SGLang's ``/generate``. Every batching mode serves the same list:

- ``static``: ``--batching static`` (a batch decodes until its longest row ends; newcomers wait);
- ``continuous``: requests join the running batch between decoding steps, one run per ``--compact``
  threshold (the engine's ``compact_below``: 0 never rewrites the cache and only reuses free slots,
  1 rewrites it whenever a row leaves, as static groups do).

Reported per run: output tokens per wall-clock second (all requests, first sent to last answered) and
p50/p99 request latency, as a markdown table.

    python bench/serve_concurrency.py --clients 1,8,32 --requests-per-client 4
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
import torch

from ringzero.config.loader import load_config
from ringzero.model.config import PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.tokenizer import CharTokenizer

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml"


def span(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(":"))
    return low, high


def workload(count: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int):
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))],
             "sampling_params": {"max_new_tokens": rng.randint(*output_len), "ignore_eos": True,
                                 "sampling_seed": rng.randrange(1 << 30)}}
            for _ in range(count)]


def closed_loop(url: str, bodies: list[dict]) -> list[tuple[float, int]]:
    """Send ``bodies`` one after another; ``(latency_s, output tokens)`` of each."""
    out = []
    with requests.Session() as session:
        for body in bodies:
            start = time.perf_counter()
            answer = session.post(url + "/generate", json=body, timeout=600)
            answer.raise_for_status()
            out.append((time.perf_counter() - start, len(answer.json()["output_ids"])))
    return out


def serve_run(model: HybridLM, batching: str, compact_below: float, clients: int, bodies: list[dict],
              max_batch: int) -> dict:
    engine = EmbeddedEngine(model, CharTokenizer(), model.policy, max_batch=max_batch, compact_below=compact_below)
    server = RolloutServer(engine, CharTokenizer(), model_path="random://bench", batching=batching)
    with ServerThread(server.app) as thread, ThreadPoolExecutor(clients) as pool:
        closed_loop(thread.url, bodies[:1])  # warm-up: first-call allocations stay out of the numbers
        start = time.perf_counter()
        results = [r for got in pool.map(lambda i: closed_loop(thread.url, bodies[i::clients]), range(clients))
                   for r in got]
        wall = time.perf_counter() - start
    latencies = sorted(lat for lat, _ in results)
    return {"tokens_s": sum(n for _, n in results) / wall, "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))], "wall": wall}


def table(rows: list[dict]) -> str:
    lines = ["| clients | batching | compact_below | requests | tokens/s | p50 latency (ms) | p99 latency (ms) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        compact = f"{r['compact_below']:g}" if r["batching"] == "continuous" else "-"
        lines.append(f"| {r['clients']} | {r['batching']} | {compact} | {r['requests']} | {r['tokens_s']:.0f} | "
                     f"{1000 * r['p50']:.0f} | {1000 * r['p99']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--prompt-len", type=span, default=(8, 96), metavar="LOW:HIGH")
    p.add_argument("--output-len", type=span, default=(8, 128), metavar="LOW:HIGH")
    p.add_argument("--compact", default="0,0.5,1", help="continuous runs' compact_below thresholds")
    p.add_argument("--max-batch", type=int, default=32, help="rows the engine decodes together")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(CONFIG).model
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    with torch.no_grad():
        random_weights_(model, torch.Generator().manual_seed(args.seed))
    modes = [("static", 1.0)] + [("continuous", float(c)) for c in args.compact.split(",")]
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        bodies = workload(clients * args.requests_per_client, args.prompt_len, args.output_len, cfg.vocab_size,
                          args.seed + clients)
        for batching, compact_below in modes:
            result = serve_run(model, batching, compact_below, clients, bodies, args.max_batch)
            rows.append({"clients": clients, "batching": batching, "compact_below": compact_below,
                         "requests": len(bodies), **result})
            print(f"clients={clients} {batching} compact_below={compact_below:g}: {result['tokens_s']:.0f} tok/s, "
                  f"p50 {1000 * result['p50']:.0f} ms, p99 {1000 * result['p99']:.0f} ms", flush=True)
    print(f"\nthreads={args.threads} load={os.getloadavg()[0]:.2f} prompt_len={args.prompt_len} "
          f"output_len={args.output_len} max_batch={args.max_batch}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
