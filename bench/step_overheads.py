"""Per-step overheads of the embedded engine and the RL trainer, each timed alone (CPU, one thread).

- ``head``: ``HybridLM.logits`` of one decoding step (8 rows) under ``fp32-islands`` (bf16 body, fp32 LM
  head), inside ``torch.inference_mode()``: the head weight's fp32 cast against the step's matmul;
- ``lightning``: one Lightning layer's parallel forward of a short sequence (decay tables included);
- ``decode``: ``EmbeddedEngine.generate`` tokens/s on the tiny model under ``fp32-islands``;
- ``stop``: per-step host cost of matching a stop string (``DecodingRows._match``) on a long output;
- ``entropy``: ``PolicyTrainer.score`` with entropy in batch-invariant mode (the first minibatch's scoring).

Only public calls present before and after the optimisations are used, so the same file times both
trees (``PYTHONPATH=<old tree> python bench/step_overheads.py``). Medians of ``--repeats`` timings.

    OMP_NUM_THREADS=1 python bench/step_overheads.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM

TINY = dict(vocab_size=64, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=352,
            kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
            head_dim=32, lightning_block_size=64, max_position_embeddings=256)


def median_seconds(fn, repeats: int, inner: int = 1) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def model(policy: str, **overrides) -> HybridLM:
    m = HybridLM(ModelConfig.model_validate({**TINY, **overrides}), PrecisionPolicy.preset(policy)).eval()
    m.reset_parameters(torch.Generator().manual_seed(0))
    return m


def bench_head(repeats: int) -> float:
    m = model("fp32-islands", vocab_size=16384, hidden_size=256, num_hidden_layers=1, layout="M")
    h = torch.randn(8, 1, 256, dtype=torch.bfloat16)
    with torch.inference_mode():
        return median_seconds(lambda: m.logits(h), repeats, inner=20)


def bench_lightning(repeats: int) -> float:
    m = model("fp32", layout="LLLL")
    layer = m.layers[0].attention
    x = torch.randn(4, 80, 128)
    pos = torch.arange(80)
    with torch.no_grad():
        return median_seconds(lambda: layer(x, pos), repeats, inner=20)


def bench_decode(repeats: int, new_tokens: int) -> float:
    from ringzero.rollout.engine.embedded import EmbeddedEngine
    from ringzero.rollout.types import GenerateRequest, SamplingParams

    m = model("fp32-islands", vocab_size=4096)
    engine = EmbeddedEngine(m, None, max_batch=16)
    reqs = [GenerateRequest(list(range(3, 19)), SamplingParams(max_new_tokens=new_tokens, seed=i)) for i in range(16)]
    return 16 * new_tokens / median_seconds(lambda: engine.generate(reqs), repeats)


def bench_stop(repeats: int, length: int) -> float:
    from ringzero.rollout.engine.rows import DecodingRows, RowSpec
    from ringzero.rollout.types import SamplingParams
    from ringzero.tokenizer import CharTokenizer

    params = SamplingParams(max_new_tokens=length, stop=("</answer>", "\n\nQuestion:"))

    def run():
        rows = DecodingRows([RowSpec(0, [5], params, 0, length, ())], CharTokenizer())
        for t in range(length):
            rows._match(0, 10 + t % 40)

    return median_seconds(run, repeats) / length


def bench_entropy(repeats: int) -> float:
    from types import SimpleNamespace

    from ringzero.rl.trainer import PolicyTrainer

    m = model("fp32", max_position_embeddings=128)
    seqs = [[3 + (i * 7 + j) % 60 for j in range(40 + 5 * i)] for i in range(4)]
    batch = SimpleNamespace(sequences=lambda rows: ([seqs[r] for r in rows], [16] * len(rows)))
    loss = SimpleNamespace(kl_coef=0.0)
    trainer = PolicyTrainer(m, None, loss, minibatches=1, max_new_tokens=64, temperature=1.0, batch_invariant=True)
    return median_seconds(lambda: trainer.score(m, batch, list(range(4)), 64, with_entropy=True), repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats and tokens (about 20 s)")
    p.add_argument("--only", default="head,lightning,decode,stop,entropy")
    args = p.parse_args()
    torch.set_num_threads(1)
    repeats, new_tokens = (5, 64) if args.quick else (15, 192)
    only = set(args.only.split(","))
    if "head" in only:
        print(f"head      logits of one step, fp32-islands, V=16384 D=256 B=8: {bench_head(repeats) * 1e6:9.1f} us")
    if "lightning" in only:
        print(f"lightning one layer forward, B=4 S=80:                        {bench_lightning(repeats) * 1e6:9.1f} us")
    if "decode" in only:
        print(f"decode    engine tok/s, tiny model V=4096, fp32-islands, 16 rows: {bench_decode(repeats, new_tokens):9.0f}")
    if "stop" in only:
        for length in (128, 2048):  # flat in the output length: the decoded tail is a bounded window
            print(f"stop      stop-string match per step, {length:4d}-token output:      "
                  f"{bench_stop(repeats, length) * 1e6:9.2f} us")
    if "entropy" in only:
        print(f"entropy   batch-invariant score with entropy, 4 rows:          {bench_entropy(repeats) * 1e3:9.1f} ms")


if __name__ == "__main__":
    main()
