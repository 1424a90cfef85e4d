"""Tokens per second of a full RL step (generate + train): ringzero vs TRL's GRPOTrainer, side by side.

Both sides get the same shape: a model of the same width and depth (ringzero's HybridLM from the config's
``model`` section; a Hugging Face ``LlamaForCausalLM`` with the same hidden_size, layers, heads, MLP width and
vocabulary), the same digit-sum prompts, ``prompts x samples`` responses per step cut into
``minibatches`` optimizer updates, and exactly ``max_new_tokens`` tokens per response (no stop token on
either side, so lengths cannot differ), fp32 on the CPU, no KL term, one process, the same threads.

A step's time runs from the start of generation to the end of its last optimizer update (weight push
included for ringzero; TRL generates from the model it trains). The first step of each side is a
warm-up and is not counted.

    python bench/rl_step_throughput.py --config configs/tiny-cpu.yaml --steps 3
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

import torch

from ringzero.config.loader import load_config
from ringzero.config.stages import LossSettings, OptimSettings, SamplingSettings
from ringzero.engines.optimizer import TrainOptimizer
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.rl.rewards import TaskReward
from ringzero.rl.step import PushingRollout, RLStep, StepShape
from ringzero.rl.trainer import PolicyTrainer
from ringzero.rollout.deployment.weight_push import WeightPusher
from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.tasks.arithmetic import SyntheticArithmetic
from ringzero.tokenizer import CharTokenizer

LR = 1e-5
EPS_HIGH = 0.28


class UnstoppedTask(SyntheticArithmetic):
    """The configured task without stop strings: every response runs to max_new_tokens on both sides."""

    stop = ()


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/tiny-cpu.yaml")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="measured RL steps per side (after one warm-up step)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def problems(cfg, n: int, seed: int = 0):
    task = UnstoppedTask(cfg.task)
    return task, task.prompts("train", n, random.Random(seed))


def time_ringzero(cfg, args) -> dict:
    torch.manual_seed(0)
    task, _ = problems(cfg, 1)
    tokenizer = CharTokenizer()
    policy = PrecisionPolicy.preset("fp32")
    model = HybridLM(cfg.model, policy)
    # No tokenizer in the engine: its eos would stop rows early, and TRL is told to run to full length too.
    engine = EmbeddedEngine(model, None, policy, max_batch=args.prompts * args.samples, seed=0)
    optimizer = TrainOptimizer(
        model, OptimSettings(lr=LR, warmup_steps=0), total_steps=1000, schedule="constant"
    )
    loss = LossSettings(kind="sg_clip_is", eps_high=EPS_HIGH, normalization="token_sum", kl_coef=0.0)
    trainer = PolicyTrainer(
        model,
        optimizer,
        loss,
        minibatches=args.minibatches,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        pad_id=tokenizer.pad_id,
        micro_batch=16,
    )
    step = RLStep(
        rollout=PushingRollout(
            engine,
            lambda s: WeightPusher("in_process").push(engine, optimizer.master_state_dict(), f"step-{s + 1}"),
        ),
        trainer=trainer,
        task=task,
        tokenizer=tokenizer,
        reward=TaskReward(task),
        sampling=SamplingSettings(max_new_tokens=args.max_new_tokens),
        shape=StepShape(args.prompts, args.samples),
        seed=0,
    )
    times, parts, tokens = [], [], []
    for s in range(args.steps + 1):
        t0 = time.perf_counter()
        m = step.run(s)
        if s:  # step 0 is the warm-up
            times.append(time.perf_counter() - t0)
            parts.append({k: m[k] for k in ("time/generate", "time/train", "time/sync")})
            batch = step.last_batch
            tokens.append((sum(batch.lengths), sum(len(p) for p in batch.prompt_ids)))
    return summarize("ringzero", times, tokens, parts)


def hf_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CharTokenizer()
    vocab = {"<pad>": chars.pad_id, "<bos>": chars.bos_id, "<eos>": chars.eos_id}
    vocab.update({c: i + 3 for i, c in enumerate(chars.alphabet)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def time_trl(cfg, args) -> dict:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    m = cfg.model
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=m.vocab_size,
            hidden_size=m.hidden_size,
            intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_hidden_layers,
            num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_attention_heads,
            max_position_embeddings=m.max_position_embeddings,
            tie_word_embeddings=m.tie_word_embeddings,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    ).float()
    task, probs = problems(cfg, args.prompts * (args.steps + 1))
    by_prompt = {p.prompt: p for p in probs}
    dataset = Dataset.from_list([{"prompt": p.prompt} for p in probs])

    def reward(prompts, completions, **_):
        return [task.reward(by_prompt[p], c) for p, c in zip(prompts, completions, strict=True)]

    ends: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    responses = args.prompts * args.samples
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to=[],
            save_strategy="no",
            logging_steps=10**6,
            per_device_train_batch_size=responses // args.minibatches,
            steps_per_generation=args.minibatches,
            num_generations=args.samples,
            max_completion_length=args.max_new_tokens,
            generation_kwargs={
                "min_new_tokens": args.max_new_tokens
            },  # no early eos: the same lengths as ringzero
            max_steps=(args.steps + 1) * args.minibatches,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=0.0,
            loss_type="cispo",
            epsilon_high=EPS_HIGH,
            shuffle_dataset=False,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            dataloader_num_workers=0,
            seed=0,
            disable_tqdm=True,
            gradient_checkpointing=False,  # TRL turns it on by default; ringzero keeps activations too
        )
        trainer = GRPOTrainer(
            model=llama,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=hf_tokenizer(),
            callbacks=[StepClock()],
        )
        start = time.perf_counter()
        trainer.train()
    boundaries = [start] + ends[args.minibatches - 1 :: args.minibatches]
    times = [b - a for a, b in zip(boundaries[1:], boundaries[2:], strict=False)]  # drop the warm-up step
    prompt_tokens = (
        sum(len(hf_tokenizer()(p.prompt)["input_ids"]) for p in probs[: args.prompts]) * args.samples
    )
    tokens = [(responses * args.max_new_tokens, prompt_tokens)] * len(times)
    return summarize("trl", times, tokens, None)


def summarize(name: str, times: list[float], tokens: list[tuple[int, int]], parts) -> dict:
    completion = sum(t[0] for t in tokens)
    total = sum(t[0] + t[1] for t in tokens)
    out = {
        "engine": name,
        "steps": len(times),
        "s_per_step": sum(times) / len(times),
        "completion_tokens_per_s": completion / sum(times),
        "all_tokens_per_s": total / sum(times),
    }
    if parts:
        for key in parts[0]:
            out[key] = sum(p[key] for p in parts) / len(parts)
    return out


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config, [])
    results = [time_ringzero(cfg, args), time_trl(cfg, args)]
    ratio = results[0]["completion_tokens_per_s"] / results[1]["completion_tokens_per_s"]
    print("| engine | s/step | completion tok/s | prompt+completion tok/s |\n|---|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['engine']} | {r['s_per_step']:.2f} | {r['completion_tokens_per_s']:.0f} | "
            f"{r['all_tokens_per_s']:.0f} |"
        )
    print(f"\nringzero / TRL (completion tokens/s): {ratio:.2f}x")
    print(
        "ringzero step parts (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in results[0].items() if k.startswith("time/"))
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "results": results, "ratio": ratio}, fh, indent=1)


if __name__ == "__main__":
    main()
