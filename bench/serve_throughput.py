"""Rollout throughput where users meet it: ``ringzero serve`` over HTTP, the in-process engine, and Hugging
Face ``generate``, side by side, on the shipped config's model, at 1 and 2 threads.

- ``server``: ``ringzero serve --init random --config configs/tiny-cpu.yaml --precision fp32`` (its context
  raised to prompt + new tokens) in its own
  process (started once per thread count with ``OMP_NUM_THREADS``), one ``POST /generate`` of ``--batch``
  prompts as ``input_ids`` with ``max_new_tokens`` and ``ignore_eos``, timed from the request to the
  answer;
- ``in-process``: ``EmbeddedEngine.generate`` on the same model (same config, fp32) in this process;
- ``hf``: ``LlamaForCausalLM.generate`` (``do_sample=True, top_k=0``, exactly ``new`` tokens) on a Llama of
  the same vocab, width, depth, heads and MLP width.

Tokens/s is batch x new tokens / wall seconds; runs are interleaved (server, in-process, hf, ...) and the
median of ``--repeats`` is reported. ``server / in-process`` is the server's own cost; ``server / hf`` the
headline a user sees.

    python bench/serve_throughput.py --md docs/bench/rollout.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests
import torch
from common import hf_llama, write_section

from ringzero.config.loader import load_config
from ringzero.model.config import PrecisionPolicy
from ringzero.model.decode_check import random_weights_
from ringzero.model.hybrid import HybridLM
from ringzero.model.vector_math import set_threads
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.rollout.replicas.weight_group import free_port
from ringzero.rollout.types import GenerateRequest, SamplingParams

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "tiny-cpu.yaml"


class Server:
    """``ringzero serve`` in its own process at ``threads`` intra-op threads."""

    def __init__(self, threads: int, max_batch: int, context: int):
        import tempfile

        import yaml

        data = yaml.safe_load(CONFIG.read_text())
        data["model"]["max_position_embeddings"] = context  # the shipped model, with room for 512 new tokens
        self.config = Path(tempfile.mkstemp(suffix=".yaml")[1])
        self.config.write_text(yaml.safe_dump(data))
        self.port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ringzero.cli.main",
                "--log-level",
                "warning",
                "serve",
                "--init",
                "random",
                "--config",
                str(self.config),
                "--precision",
                "fp32",
                "--port",
                str(self.port),
                "--max-batch",
                str(max_batch),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"ringzero serve exited: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError("ringzero serve did not come up in 120 s")

    def generate(self, prompts: list[list[int]], new_tokens: int) -> int:
        body = {
            "input_ids": prompts,
            "sampling_params": [
                {"max_new_tokens": new_tokens, "ignore_eos": True, "sampling_seed": i}
                for i in range(len(prompts))
            ],
        }
        answer = requests.post(self.url + "/generate", json=body, timeout=1800)
        answer.raise_for_status()
        return sum(len(item["output_ids"]) for item in answer.json())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.config.unlink()


def shipped_model(context: int) -> HybridLM:
    cfg = load_config(CONFIG).model.model_copy(update={"max_position_embeddings": context})
    model = HybridLM(cfg, PrecisionPolicy.preset("fp32")).eval()
    random_weights_(model, torch.Generator().manual_seed(0))
    return model


def measure(threads: int, batch: int, prompt_len: int, lengths: list[int], repeats: int) -> list[dict]:
    set_threads(threads)
    model = shipped_model(prompt_len + max(lengths))
    engine = EmbeddedEngine(model, None, model.policy, max_batch=batch)
    hf = hf_llama(model.cfg)
    prompts_BP = torch.randint(
        3, model.cfg.vocab_size, (batch, prompt_len), generator=torch.Generator().manual_seed(1)
    )
    server = Server(threads, batch, prompt_len + max(lengths))
    rows = []
    try:
        for new in lengths:
            tok = measure_length(server, engine, hf, prompts_BP, new, repeats)
            rows.append({"threads": threads, "new": new, **tok})
            print(
                f"threads {threads} new {new}: " + ", ".join(f"{k} {v:,.0f} tok/s" for k, v in tok.items()),
                flush=True,
            )
    finally:
        server.close()
    return rows


def measure_length(
    server: Server, engine: EmbeddedEngine, hf, prompts_BP: torch.Tensor, new: int, repeats: int
) -> dict[str, float]:
    """Tokens/s of the three generators for ``new`` tokens per prompt (medians of interleaved runs)."""
    batch, prompt_len = prompts_BP.shape
    prompts = prompts_BP.tolist()
    requests_ = [
        GenerateRequest(p, SamplingParams(max_new_tokens=new, seed=i, ignore_eos=True))
        for i, p in enumerate(prompts)
    ]

    def run_server():
        assert server.generate(prompts, new) == batch * new

    def run_engine():
        out = engine.generate(requests_)
        assert sum(len(c.output_ids) for (c,) in out) == batch * new

    def run_hf():
        with torch.inference_mode():
            out = hf.generate(
                prompts_BP,
                attention_mask=torch.ones_like(prompts_BP),
                do_sample=True,
                top_k=0,
                max_new_tokens=new,
                min_new_tokens=new,
            )
        assert out.shape == (batch, prompt_len + new)

    runners = {"server": run_server, "in-process": run_engine, "hf": run_hf}
    for fn in runners.values():  # warm-up
        fn()
    seconds = {name: [] for name in runners}
    for _ in range(repeats):
        for name, fn in runners.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return {name: batch * new / statistics.median(s) for name, s in seconds.items()}


def table(rows: list[dict], batch: int, prompt_len: int) -> str:
    lines = [
        f"Batch {batch} prompts of {prompt_len} tokens, `ignore_eos`, fp32, the model of "
        "`configs/tiny-cpu.yaml` (random weights), medians of interleaved runs.",
        "",
        "| threads | new tokens | server tok/s | in-process tok/s | HF generate tok/s | server / in-process "
        "| "
        "server / HF | in-process / HF |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['new']} | {r['server']:,.0f} | {r['in-process']:,.0f} | {r['hf']:,.0f} | "
            f"{r['server'] / r['in-process']:.2f} | {r['server'] / r['hf']:.2f}x | "
            f"{r['in-process'] / r['hf']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", default="128,512")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--md", type=Path, help="write the table as a markdown section into this file")
    args = p.parse_args()
    lengths = [int(x) for x in args.new_tokens.split(",")]
    rows = []
    for threads in [int(x) for x in args.threads.split(",")]:
        rows += measure(threads, args.batch, args.prompt_len, lengths, args.repeats)
    text = (
        table(rows, args.batch, args.prompt_len)
        + f"\n\nLoad average after the run: {os.getloadavg()[0]:.2f}."
    )
    print(text)
    if args.md:
        write_section(
            args.md,
            "serve-throughput",
            "## Server, in-process engine and HF generate\n\n`python bench/serve_throughput.py`\n\n" + text,
        )


if __name__ == "__main__":
    main()
