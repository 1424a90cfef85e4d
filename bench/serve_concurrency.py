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

Reported per run: output tokens per wall-clock second (all requests, first sent to last answered),
p50/p99 request latency, and ``achieved / ideal``: the tokens/s an ideal continuous batcher would reach on
the same closed-loop workload with this engine, from the engine's own decode-step time at each live batch
size (measured in this process at 1, 2, 4, ... ``--max-batch`` rows, the median of three runs, and
interpolated) and a simulation of the clients (every step decodes one token of each live row; a finished row's
client sends its next request, which joins at the next step while a slot is free), as a markdown table. The
engine runs on this process's main thread and HTTP on another, as in ``ringzero serve``; the clients run in a
process of their own, as a trainer's ranks do (``--clients-in thread``: as threads of the server's process,
whose Python then competes with the engine for the GIL); ``--no-http`` sends the same requests straight to the
server's scheduler, so the batching loop's own cost is separate from HTTP's.

    python bench/serve_concurrency.py --clients 1,8,32 --requests-per-client 4
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing
import os
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import requests
import torch

from ringzero.config.loader import load_config
from ringzero.model.config import PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.vector_math import set_threads
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.server.app import RolloutServer, ServerThread
from ringzero.rollout.types import GenerateRequest, SamplingParams
from ringzero.tokenizer import CharTokenizer

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml"


def span(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(":"))
    return low, high


def workload(count: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int):
    rng = random.Random(seed)
    return [
        {
            "input_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(*prompt_len))],
            "sampling_params": {
                "max_new_tokens": rng.randint(*output_len),
                "ignore_eos": True,
                "sampling_seed": rng.randrange(1 << 30),
            },
        }
        for _ in range(count)
    ]


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


def drive_clients(url: str, bodies: list[dict], clients: int) -> dict:
    """The closed-loop clients as a process of their own (``--clients-in process``): one warm-up request,
    then ``clients`` threads; returns every ``(latency, tokens)`` and the wall time."""
    closed_loop(url, bodies[:1])
    with ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        results = [
            r for got in pool.map(lambda i: closed_loop(url, bodies[i::clients]), range(clients)) for r in got
        ]
        return {"results": results, "wall": time.perf_counter() - start}


def scheduled_loop(scheduler, bodies: list[dict]) -> list[tuple[float, int]]:
    """``closed_loop`` straight into the server's scheduler, without HTTP (``--no-http``)."""
    out = []
    for body in bodies:
        sp = body["sampling_params"]
        request = GenerateRequest(
            body["input_ids"],
            SamplingParams(
                max_new_tokens=sp["max_new_tokens"], ignore_eos=sp["ignore_eos"], seed=sp["sampling_seed"]
            ),
        )
        start = time.perf_counter()
        ((completion,),) = scheduler.generate([request]).result()
        out.append((time.perf_counter() - start, len(completion.output_ids)))
    return out


def serve_run(
    model: HybridLM,
    batching: str,
    compact_below: float,
    clients: int,
    bodies: list[dict],
    max_batch: int,
    http: bool = True,
    clients_in: str = "process",
) -> dict:
    engine = EmbeddedEngine(
        model, CharTokenizer(), model.policy, max_batch=max_batch, compact_below=compact_below
    )
    server = RolloutServer(engine, CharTokenizer(), model_path="random://bench", batching=batching)
    server.external_scheduler = True  # the engine on this (main) thread, as ringzero serve runs it
    out: dict = {}

    def drive(send) -> None:
        try:
            with ThreadPoolExecutor(clients) as pool:
                send(bodies[:1])  # warm-up: first-call allocations stay out of the numbers
                start = time.perf_counter()
                out["results"] = [
                    r for got in pool.map(lambda i: send(bodies[i::clients]), range(clients)) for r in got
                ]
                out["wall"] = time.perf_counter() - start
        finally:
            server.scheduler.stop()

    def drive_elsewhere(url: str) -> None:
        # the clients in a process of their own, as a trainer's ranks are: their Python never takes this
        # process's GIL from the engine
        try:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                out.update(pool.submit(drive_clients, url, bodies, clients).result())
        finally:
            server.scheduler.stop()

    with contextlib.ExitStack() as stack:
        if http:
            url = stack.enter_context(ServerThread(server.app)).url
            if clients_in == "process":
                driver = threading.Thread(target=drive_elsewhere, args=(url,))
            else:
                driver = threading.Thread(target=drive, args=(functools.partial(closed_loop, url),))
        else:
            driver = threading.Thread(
                target=drive, args=(functools.partial(scheduled_loop, server.scheduler),)
            )
        driver.start()
        server.scheduler.run_here()
        driver.join()
    results, wall = out["results"], out["wall"]
    latencies = sorted(lat for lat, _ in results)
    return {
        "tokens_s": sum(n for _, n in results) / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
        "wall": wall,
    }


def step_times(model: HybridLM, max_batch: int, prompt_len: int, steps: int) -> dict[int, float]:
    """Seconds per decoding step of the engine at 1, 2, 4, ... ``max_batch`` live rows (prefill included,
    spread over the steps), over the workload's mean prompt and output lengths (MLA's step cost grows with
    the context)."""
    out = {}
    sizes = sorted({min(2**k, max_batch) for k in range(max_batch.bit_length() + 1)})
    for b in sizes:
        engine = EmbeddedEngine(model, None, model.policy, max_batch=max_batch)
        reqs = [
            GenerateRequest([5] * prompt_len, SamplingParams(max_new_tokens=steps, ignore_eos=True, seed=i))
            for i in range(b)
        ]
        engine.generate(reqs)  # warm-up
        runs = []
        for _ in range(3):  # the median of three: one run on this shared machine moves by a third
            start = time.perf_counter()
            engine.generate(reqs)
            runs.append((time.perf_counter() - start) / steps)
        out[b] = statistics.median(runs)
    return out


def step_time(curve: dict[int, float], b: int) -> float:
    sizes = sorted(curve)
    hi = next((s for s in sizes if s >= b), sizes[-1])
    lo = max((s for s in sizes if s <= b), default=sizes[0])
    if hi == lo:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (b - lo) / (hi - lo)


def ideal_tokens_s(curve: dict[int, float], bodies: list[dict], clients: int, max_batch: int) -> float:
    """Output tokens/s of an ideal continuous batcher on the closed-loop workload (see the module
    docstring)."""
    queues = [[b["sampling_params"]["max_new_tokens"] for b in bodies[i::clients]] for i in range(clients)]
    waiting = [(i, queues[i].pop(0)) for i in range(clients) if queues[i]]
    live: list[list[int]] = []  # [client, tokens left]
    seconds = tokens = 0.0
    while waiting or live:
        while waiting and len(live) < max_batch:
            client, left = waiting.pop(0)
            live.append([client, left])
        seconds += step_time(curve, len(live))
        tokens += len(live)
        for row in live:
            row[1] -= 1
        for client, _ in [r for r in live if r[1] == 0]:
            if queues[client]:
                waiting.append((client, queues[client].pop(0)))
        live = [r for r in live if r[1] > 0]
    return tokens / seconds


def table(rows: list[dict]) -> str:
    lines = [
        "| clients | batching | compact_below | requests | tokens/s | achieved / ideal | p50 latency (ms) | "
        "p99 latency (ms) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        compact = f"{r['compact_below']:g}" if r["batching"] == "continuous" else "-"
        lines.append(
            f"| {r['clients']} | {r['batching']} | {compact} | {r['requests']} | {r['tokens_s']:.0f} | "
            f"{r['tokens_s'] / r['ideal']:.2f} | {1000 * r['p50']:.0f} | {1000 * r['p99']:.0f} |"
        )
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
    p.add_argument(
        "--clients-in",
        choices=("process", "thread"),
        default="process",
        help="HTTP clients in a process of their own (as a trainer's ranks are), or as threads of the "
        "server's process (their Python then competes with the engine for its GIL)",
    )
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        metavar="S",
        help="sys.setswitchinterval for this process (Python's default 0.005 s): how long a thread may "
        "hold the GIL while another waits for it",
    )
    p.add_argument(
        "--no-http",
        action="store_true",
        help="clients submit straight to the server's scheduler: the batching loop without HTTP "
        "(under `python -m cProfile -s cumulative` it shows where a step's time goes)",
    )
    args = p.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    set_threads(args.threads)
    cfg = load_config(CONFIG).model
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32"))
    with torch.no_grad():
        random_weights_(model, torch.Generator().manual_seed(args.seed))
    modes = [("static", 1.0)] + [("continuous", float(c)) for c in args.compact.split(",")]
    curve = step_times(model, args.max_batch, sum(args.prompt_len) // 2, sum(args.output_len) // 2)
    print(
        "engine seconds per decoding step by live rows: "
        + ", ".join(f"{b}: {1000 * t:.2f} ms" for b, t in curve.items()),
        flush=True,
    )
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        bodies = workload(
            clients * args.requests_per_client,
            args.prompt_len,
            args.output_len,
            cfg.vocab_size,
            args.seed + clients,
        )
        ideal = ideal_tokens_s(curve, bodies, clients, args.max_batch)
        for batching, compact_below in modes:
            result = serve_run(
                model,
                batching,
                compact_below,
                clients,
                bodies,
                args.max_batch,
                http=not args.no_http,
                clients_in=args.clients_in,
            )
            rows.append(
                {
                    "clients": clients,
                    "batching": batching,
                    "compact_below": compact_below,
                    "requests": len(bodies),
                    "ideal": ideal,
                    **result,
                }
            )
            print(
                f"clients={clients} {batching} compact_below={compact_below:g}: {result['tokens_s']:.0f} "
                "tok/s "
                f"({result['tokens_s'] / ideal:.2f} of the ideal {ideal:.0f}), "
                f"p50 {1000 * result['p50']:.0f} ms, p99 {1000 * result['p99']:.0f} ms",
                flush=True,
            )
    http = "no HTTP" if args.no_http else f"HTTP, clients in a {args.clients_in}"
    print(
        f"\n{http}, threads={args.threads} load={os.getloadavg()[0]:.2f} prompt_len={args.prompt_len} "
        f"output_len={args.output_len} max_batch={args.max_batch}\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
