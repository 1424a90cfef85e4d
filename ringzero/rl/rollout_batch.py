"""Sampling and scoring of one rollout batch: prompts -> n completions each -> rewards, as padded tensors.

The rollout client's log-probs become ``logp_rollout_NT``, the importance ratio's denominator. Responses
of one prompt sit next to each other (``group_size`` rows), as ``group_advantages`` expects.

Letter legend: N responses (prompts x samples), T response positions (the longest response).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from ringzero.rl.openings import Opening, forced_requests, own_request, prefixed
from ringzero.rollout.types import Completion, GenerateRequest, RolloutClient, SamplingParams
from ringzero.tasks.base import Problem, Task
from ringzero.tokenizer.base import Tokenizer

RewardFn = Callable[[Problem, str, int, bool], float]
"""``reward(problem, response_text, response_tokens, truncated)``: see ``ringzero.rl.rewards``."""


def encode_prompt(tokenizer: Tokenizer, problem: Problem) -> list[int]:
    """BOS + prompt text: pretraining windows start the same way, so RL prompts look like corpus text."""
    return tokenizer.encode(problem.prompt, add_bos=True)


def stop_settings(task: Task, tokenizer: Tokenizer) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``(stop_strings, stop_token_ids)``: a stop string that is one token becomes a stop id, which the
    engine checks for all rows at once instead of decoding each row's tail every step."""
    strings, ids = [], []
    for s in task.stop:
        encoded = tokenizer.encode(s)
        if len(encoded) == 1:
            ids.append(encoded[0])
        else:
            strings.append(s)
    return tuple(strings), tuple(ids)


def sampling_params(
    sampling, task: Task, tokenizer: Tokenizer, n: int, seed: int | None, temperature: float | None = None
) -> SamplingParams:
    """SGLang-named params from a stage's ``SamplingSettings``; ``temperature`` overrides (0 = greedy)."""
    strings, ids = stop_settings(task, tokenizer)
    return SamplingParams(
        max_new_tokens=sampling.max_new_tokens,
        temperature=sampling.temperature if temperature is None else temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        stop=strings,
        stop_token_ids=ids,
        n=n,
        seed=seed,
    )


@dataclass
class RolloutBatch:
    problems: list[Problem]  # per response (each prompt's problem repeated group_size times)
    prompt_ids: list[list[int]]
    output_ids: list[list[int]]
    responses: list[str]
    logp_rollout_NT: torch.Tensor  # float64 (as reported), 0 outside the mask
    mask_NT: torch.Tensor  # bool: sampled response tokens
    rewards_N: torch.Tensor  # float32
    correct: list[bool]  # the task's own verdict, before any tier budget
    truncated: list[bool]  # cut by max_new_tokens rather than a stop
    uses_trace: list[bool]
    group_size: int
    # int32 [len(prompt) + len(output) - 1, layers, K] per response when the engine reported them (replay)
    routed_experts: list | None = None
    forced: list[bool] | None = None  # opened by a forced prefix (ringzero.rl.openings); None: none was

    def __len__(self) -> int:
        return len(self.output_ids)

    @property
    def lengths(self) -> list[int]:
        return [len(o) for o in self.output_ids]

    def sequences(self, rows: Sequence[int]) -> tuple[list[list[int]], list[int]]:
        """``(prompt + response ids, prompt lengths)`` of ``rows``: what ``score_sequences`` takes."""
        return (
            [self.prompt_ids[i] + self.output_ids[i] for i in rows],
            [len(self.prompt_ids[i]) for i in rows],
        )


def pad_rows(
    rows: Sequence[Sequence[float]] | Sequence[torch.Tensor], width: int, dtype, device=None
) -> torch.Tensor:
    """``[len(rows), width]``, zeros after each row's end. Python rows are uploaded in one copy; tensor
    rows are padded where they live (on ``device`` when given)."""
    if rows and isinstance(rows[0], torch.Tensor):
        dev = device if device is not None else rows[0].device
        return torch.stack([torch.nn.functional.pad(r.to(dev, dtype), (0, width - r.shape[0])) for r in rows])
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=dtype, device=device).reshape(
        len(rows), width
    )


def collect(
    client: RolloutClient,
    task: Task,
    tokenizer: Tokenizer,
    problems: Sequence[Problem],
    *,
    samples: int,
    params: SamplingParams,
    reward: RewardFn,
    seeds: Sequence[int] | None = None,
    device=None,
    routed_experts: bool = False,
    opening: Opening | None = None,
) -> RolloutBatch:
    """``samples`` completions per problem from ``client``, decoded and rewarded; the batch's tensors
    are made on ``device`` (the trainer's), each in one upload.

    ``seeds``: one sampling seed per problem (overrides ``params.seed``), so prompts never share a
    random stream while the whole batch stays reproducible. ``routed_experts``: ask the engine for each
    token's experts (routing replay) and keep them. ``opening``: the last ``opening.samples`` of each
    problem's samples start from a forced prefix (``ringzero.rl.openings``; ``forced`` marks them), of the
    problems it applies to (``Opening.applies``); the others' samples are all the policy's.
    """
    per_request = [params] * len(problems) if seeds is None else [replace(params, seed=s) for s in seeds]
    requests = [
        GenerateRequest(encode_prompt(tokenizer, p), sp, rid=p.id, return_routed_experts=routed_experts)
        for p, sp in zip(problems, per_request, strict=True)
    ]
    groups = [
        [own_request(req, opening), *forced_requests(req, opening)]
        if opening is not None and opening.applies(p)
        else [req]
        for p, req in zip(problems, requests, strict=True)
    ]
    flat_requests = [r for g in groups for r in g]
    results = client.generate(flat_requests)
    flat: list[tuple[Problem, list[int], list[int], list[float], Completion, bool]] = []
    at = 0
    for problem, group in zip(problems, groups, strict=True):
        mine, at = results[at : at + len(group)], at + len(group)
        if sum(len(completions) for completions in mine) != samples:
            got = sum(len(completions) for completions in mine)
            raise ValueError(f"rollout client returned {got} completions, asked for {samples}")
        prompt = list(group[0].input_ids)
        for j, completions in enumerate(mine):
            for c in completions:
                ids, lps = prefixed(c, len(prompt)) if j else (list(c.output_ids), list(c.output_logprobs))
                flat.append((problem, prompt, ids, lps, c, bool(j)))
    texts = [tokenizer.decode(ids) for _, _, ids, _, _, _ in flat]
    # a guess is a whole response, scored with no token decoded: it ends by its stop, not the length cap
    guessed = opening is not None and opening.guesses is not None
    truncated = [c.finish_reason == "length" and not (forced and guessed) for *_, c, forced in flat]
    correct = [task.reward(f[0], text) >= 1.0 for f, text in zip(flat, texts, strict=True)]
    rewards = [
        reward(f[0], text, len(f[2]), cut) for f, text, cut in zip(flat, texts, truncated, strict=True)
    ]
    lengths = [len(ids) for _, _, ids, _, _, _ in flat]
    width = max(lengths, default=0)
    return RolloutBatch(
        problems=[f[0] for f in flat],
        prompt_ids=[f[1] for f in flat],
        output_ids=[f[2] for f in flat],
        responses=texts,
        logp_rollout_NT=pad_rows([f[3] for f in flat], width, torch.float64, device),
        mask_NT=pad_rows([[True] * n for n in lengths], width, torch.bool, device),
        rewards_N=torch.tensor(rewards, dtype=torch.float32, device=device),
        correct=correct,
        truncated=truncated,
        uses_trace=[task.uses_trace(t) for t in texts],
        group_size=samples,
        routed_experts=[_experts(f[4]) for f in flat] if routed_experts else None,
        forced=None if opening is None else [f[5] for f in flat],
    )


def _experts(c: Completion):
    expected = len(c.prompt_ids) + len(c.output_ids) - 1
    if c.routed_experts is None or c.routed_experts.shape[0] != expected:
        got = None if c.routed_experts is None else list(c.routed_experts.shape)
        raise ValueError(
            f"routing replay: the rollout engine reported experts of shape {got} for a sequence of "
            f"{expected} fed tokens"
        )
    return c.routed_experts
