"""The pieces of self-distillation that need no engine: choosing the trace per prompt, batching, the loss.

Letter legend: B examples in a batch, S columns (prompt + response, right-padded), V vocab.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ringzero.rl.rollout_batch import RolloutBatch


@dataclass(frozen=True)
class Sample:
    output_ids: list[int]
    correct: bool
    truncated: bool  # cut by the length cap: it never learned to stop, so it is never a target
    verified: bool = False  # a worked trace whose every step checks (``Task.step_check``)


def shortest_correct(samples: Sequence[Sample], length_budget: int | None = None) -> int | None:
    """Index of the shortest correct, finished sample, or None when there is none.

    Verified traces go first: a correct answer after a trace whose steps do not hold, or a bare answer
    from a policy that otherwise reasons, is usually a lucky guess (digit-sum's direct route is right
    one time in ten), and the shortest correct sample of a prompt is exactly where such guesses win.
    Training on them would distil guessing, not a shorter trace. Among equals the first sample wins;
    ``length_budget`` drops correct samples longer than it (in tokens) before choosing.
    """
    eligible = [
        i
        for i, s in enumerate(samples)
        if s.correct and not s.truncated and (length_budget is None or len(s.output_ids) <= length_budget)
    ]
    return min(eligible, key=lambda i: (not samples[i].verified, len(samples[i].output_ids)), default=None)


def random_correct(
    samples: Sequence[Sample], rng: random.Random, length_budget: int | None = None
) -> int | None:
    """Index of a random correct, finished sample, drawn among the verified ones when there are any: the
    control of ``shortest_correct``, eligible exactly where it is (same prompts kept, same preference for
    verified traces), with the choice among them left to chance instead of length."""
    eligible = [
        i
        for i, s in enumerate(samples)
        if s.correct and not s.truncated and (length_budget is None or len(s.output_ids) <= length_budget)
    ]
    if not eligible:
        return None
    verified = [i for i in eligible if samples[i].verified]
    return rng.choice(verified or eligible)


def verified_trace(task, problem, response: str) -> bool:
    return task.verified(response, problem)


def select_traces(
    batch: RolloutBatch, task, length_budget: int | None, select: str = "shortest", seed: int = 0
) -> list[dict]:
    """One ``{"prompt_ids", "output_ids", "verified"}`` example per prompt that has an eligible sample:
    the shortest (``select: shortest``) or a random one drawn from ``seed``."""
    rng = random.Random(seed)
    examples = []
    for start in range(0, len(batch), batch.group_size):
        group = range(start, start + batch.group_size)
        samples = [
            Sample(
                batch.output_ids[i],
                batch.correct[i],
                batch.truncated[i],
                batch.correct[i] and verified_trace(task, batch.problems[i], batch.responses[i]),
            )
            for i in group
        ]
        pick = (
            shortest_correct(samples, length_budget)
            if select == "shortest"
            else random_correct(samples, rng, length_budget)
        )
        if pick is not None:
            examples.append(
                {
                    "prompt_ids": batch.prompt_ids[start + pick],
                    "output_ids": samples[pick].output_ids,
                    "verified": samples[pick].verified,
                }
            )
    return examples


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The example order of one epoch: a function of (seed, epoch) only, so a resumed run sees the same."""
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


def sft_batch(examples: Sequence[dict], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids_BS, target_mask_BS1)``: prompt + response right-padded; the mask marks the positions whose
    *next* token is a response token, i.e. the logits the loss reads (``S - 1`` columns)."""
    seqs = [list(e["prompt_ids"]) + list(e["output_ids"]) for e in examples]
    width = max(len(s) for s in seqs)
    ids_BS = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask_BS1 = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
    for row, (seq, e) in enumerate(zip(seqs, examples, strict=True)):
        ids_BS[row, : len(seq)] = torch.as_tensor(seq)
        plen = len(e["prompt_ids"])
        mask_BS1[row, plen - 1 : len(seq) - 1] = True
    return ids_BS, mask_BS1


def response_loss(model, ids_BS: torch.Tensor, mask_BS1: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over response tokens: the prompt is given, not learned."""
    logits_BSV = model(ids_BS[:, :-1])
    # FP32 island: the log-softmax of the loss, whatever the body dtype.
    nll_BS1 = F.cross_entropy(logits_BSV.float().transpose(1, 2), ids_BS[:, 1:], reduction="none")
    return (nll_BS1 * mask_BS1).sum() / mask_BS1.sum().clamp(min=1)
