"""Decode tokens/s with and without CUDA graphs (results in $OUT/decode_graphs.json when OUT is set).

Three ways to run the same greedy one-token step after a left-padded prefill, per precision preset and
batch size:

- ``eager dynamic``: ``DecodeCache`` (what the embedded engine's model calls use today), preallocated to
  the full length so it never regrows;
- ``eager static``: ``StaticDecodeCache``: fixed ``[B, C]`` buffers, attention over all C columns;
- ``cuda graph``: the static step (forward + argmax written into the static input) captured once with
  ``torch.cuda.CUDAGraph`` and replayed per token.

Only the decoding loop is timed (CUDA synchronised before each clock read); prefill is not. Before
timing, the graph's tokens and logits over a few steps are compared with eager static decoding, and
eager static with eager dynamic (max abs logit difference, tokens equal). One eager static step runs
under ``torch.cuda.set_sync_debug_mode("error")``: a host sync in the step would stop the script.

    python bench/gpu/decode_graphs.py            # on the GPU machine
    python bench/gpu/decode_graphs.py --smoke    # on the CPU, tiny sizes, no capture
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from ringzero.model.cache import left_padded
from ringzero.model.config import ModelConfig, PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.static_cache import new_static_cache

WARM_STEPS = 3  # eager steps before timing / capture (kernel selection, the model's cached casts)


def model_config(args) -> ModelConfig:
    return ModelConfig.model_validate(
        dict(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            layer_group_size=args.group,
            head_dim=args.head_dim,
            partial_rotary_factor=0.5,
            qk_rope_head_dim=args.head_dim // 2,
            qk_nope_head_dim=args.head_dim,
            v_head_dim=args.head_dim,
            kv_lora_rank=args.kv_lora_rank,
            intermediate_size=args.intermediate,
            group_norm_size=args.group_norm,
            max_position_embeddings=args.prompt + args.new_tokens + 64,
        )
    )


def prompts(batch: int, length: int, vocab: int, device):
    """Left-padded prompts of lengths length/2 .. length, as a rollout batch has."""
    g = torch.Generator().manual_seed(batch)
    lens = torch.randint(max(1, length // 2), length + 1, (batch,), generator=g).tolist()
    lens[0] = length
    return left_padded([torch.randint(1, vocab, (n,), generator=g).tolist() for n in lens], 0, device)


def prefill(model, cache, ids, pos) -> torch.Tensor:
    """The first new token per row ``[B, 1]`` (the head runs on the last column only)."""
    return model.logits(model.hidden(ids, pos, cache)[:, -1:]).argmax(-1)


def eager_decode(model, cache, tok, steps: int, keep: int = 0):
    """Greedy steps; returns (seconds, logits of the first ``keep`` steps, tokens of those steps)."""
    logits_kept, toks_kept = [], []
    sync(tok.device)
    started = time.perf_counter()
    for s in range(steps):
        logits = model(tok, cache=cache)[:, -1]
        tok = logits.argmax(-1, keepdim=True)
        if s < keep:
            logits_kept.append(logits.clone())
            toks_kept.append(tok)
    sync(tok.device)
    return time.perf_counter() - started, logits_kept, toks_kept


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def max_abs(a: list, b: list) -> float:
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True)), default=0.0)


def same_tokens(a: list, b: list) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


class GraphStep:
    """One decoding step captured on a ``StaticDecodeCache``: ``replay`` reads ``ids`` ``[B, 1]``, writes
    the greedy next token back into it and the step's logits into ``logits``."""

    def __init__(self, model, cache, ids_B1):
        self.ids = ids_B1

        def step():
            logits = model(self.ids, cache=cache)[:, -1]
            self.ids.copy_(logits.argmax(-1, keepdim=True))
            return logits

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graphs asks
            for _ in range(WARM_STEPS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        # The graph replays raw addresses of tensors the model caches between calls (decay tables, the
        # head's cast), made by now; holding them keeps them alive should the model's caches drop them.
        self._pinned = [dict(b.attention.decays._tables) for b in model.layers if b.kind == "lightning"] + [
            model._head_cast
        ]
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = step()

    def decode(self, steps: int, keep: int = 0):
        logits_kept, toks_kept = [], []
        torch.cuda.synchronize()
        started = time.perf_counter()
        for s in range(steps):
            self.graph.replay()
            if s < keep:
                logits_kept.append(self.logits.clone())
                toks_kept.append(self.ids.clone())
        torch.cuda.synchronize()
        return time.perf_counter() - started, logits_kept, toks_kept


def one_case(model, batch: int, args, device) -> dict:
    ids, pos = prompts(batch, args.prompt, args.vocab, device)
    capacity = ids.shape[1] + args.new_tokens
    keep, rows = args.check_steps, []

    def timed(name, seconds):
        rows.append(
            {
                "mode": name,
                "seconds": round(seconds, 4),
                "tokens_per_s": round(batch * args.new_tokens / seconds, 1),
                "ms_per_step": round(1e3 * seconds / args.new_tokens, 3),
            }
        )

    # eager dynamic: a warm-up run, then the timed one on a fresh cache
    for warm in (True, False):
        cache = model.new_cache(batch, capacity=capacity)
        tok = prefill(model, cache, ids, pos)
        secs, dyn_logits, dyn_toks = eager_decode(
            model, cache, tok, WARM_STEPS if warm else args.new_tokens, 0 if warm else keep
        )
    timed("eager dynamic", secs)
    del cache
    cache = new_static_cache(model, batch, capacity)
    for warm in (True, False):
        cache.reset()
        tok = prefill(model, cache, ids, pos)
        if warm and device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")  # a host sync in the step raises here
            try:
                model(tok, cache=cache)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            cache.reset()
            tok = prefill(model, cache, ids, pos)
        secs, st_logits, st_toks = eager_decode(
            model, cache, tok, WARM_STEPS if warm else args.new_tokens, 0 if warm else keep
        )
    timed("eager static", secs)
    check = {
        "static_vs_dynamic_max_abs": max_abs(st_logits, dyn_logits),
        "static_vs_dynamic_tokens_equal": same_tokens(st_toks, dyn_toks),
    }
    if device.type == "cuda":
        cache.reset()
        static_ids = prefill(model, cache, ids, pos).clone()
        graph = GraphStep(model, cache, static_ids)
        for timed_run in (False, True):  # a check over `keep` steps, then the timed run
            cache.reset()
            static_ids.copy_(prefill(model, cache, ids, pos))
            secs, g_logits, g_toks = graph.decode(
                args.new_tokens if timed_run else keep, 0 if timed_run else keep
            )
            if not timed_run:
                check["graph_vs_eager_static_max_abs"] = max_abs(g_logits, st_logits)
                check["graph_vs_eager_static_tokens_equal"] = same_tokens(g_toks, st_toks)
        timed("cuda graph", secs)
        del graph
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_eager_dynamic"] = round(r["tokens_per_s"] / base, 2)
    return {"batch": batch, "capacity": capacity, "rows": rows, "check": check}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, no capture")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--group", type=int, default=4, help="layer_group_size: every group-th layer is MLA")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument(
        "--head-dim", type=int, default=128, help="Lightning head dim; MLA nope/v dims, rope = half"
    )
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=2816)
    p.add_argument("--group-norm", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch-sizes", default="1,16,64,256")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--check-steps", type=int, default=8)
    p.add_argument("--presets", default="fp32-islands,bf16")
    p.add_argument(
        "--budget-s", type=float, default=60.0, help="start no new (batch size, preset) after this"
    )
    args, _ = p.parse_known_args()  # run.sh may pass other scripts' flags
    if args.smoke:
        args.hidden, args.layers, args.group, args.heads, args.head_dim = 32, 4, 2, 2, 8
        args.kv_lora_rank, args.intermediate, args.group_norm, args.vocab = 8, 48, 2, 64
        args.batch_sizes, args.prompt, args.new_tokens, args.check_steps = "1,3", 6, 8, 4
    started = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    cfg = model_config(args)
    out = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "config": cfg.model_dump(),
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "cases": [],
        "skipped": [],
    }
    if device.type != "cuda":
        print("cuda graphs: skipped (no CUDA)")
    models = {}
    for preset in args.presets.split(","):
        torch.manual_seed(0)
        with device:
            models[preset] = HybridLM(cfg, PrecisionPolicy.preset(preset)).eval()
    with torch.inference_mode():
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for preset, model in models.items():
                if time.perf_counter() - started > args.budget_s:
                    out["skipped"].append(
                        {"batch": batch, "preset": preset, "why": f"past --budget-s {args.budget_s}"}
                    )
                    continue
                case = one_case(model, batch, args, device)
                out["cases"].append({"preset": preset, **case})
                print(
                    f"batch {batch} {preset}: "
                    + ", ".join(f"{r['mode']} {r['tokens_per_s']} tok/s" for r in case["rows"])
                    + f"; {case['check']}",
                    flush=True,
                )
                write(out, started)  # after every case: a run stopped by its timeout keeps what finished
    write(out, started)
    print("\n| preset | batch | mode | tokens/s | ms/step | x eager dynamic |\n|---|---:|---|---:|---:|---:|")
    for c in out["cases"]:
        for r in c["rows"]:
            print(
                f"| {c['preset']} | {c['batch']} | {r['mode']} | {r['tokens_per_s']} | {r['ms_per_step']} | "
                f"{r['speedup_vs_eager_dynamic']} |"
            )
    for s in out["skipped"]:
        print(f"batch {s['batch']} {s['preset']} skipped: {s['why']}")
    print(f"total {out['seconds']} s")


def write(out: dict, started: float) -> None:
    out["seconds"] = round(time.perf_counter() - started, 1)
    if os.environ.get("OUT"):
        target = Path(os.environ["OUT"])
        target.mkdir(parents=True, exist_ok=True)
        (target / "decode_graphs.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
