"""Forced openings: a share of each prompt's samples starts from a fixed prefix (AdaptThink's cold start).

Tier RL asks a policy that always thinks to learn when not to. Sampling alone never finds the short
answer once stage 1 and distillation have made thinking the only mode: the empty thought's first-token
probability is ~0, so no fast-tier group on a long item holds a within-budget sample to reinforce and
every such group's advantages are zero. AdaptThink (Zhang et al., 2025) forces the NoThinking opening
on part of the samples; here ``samples`` of each prompt's ``n`` open with ``ids`` (the empty thought
``<think> </think>`` by default) and the policy writes the rest.

``forced_opening.tiers`` limits the forced samples to prompts asked at the listed tiers (``tags``: their
tags, None for the untagged tier): AdaptThink forces the NoThinking opening to teach the fast mode, and a
deep or untagged prompt whose samples are forced short learns to answer short where it should think.
Other prompts get all their samples from the policy; every group keeps its size.

The forced tokens are part of the response: they count toward its length and budget, and the loss
trains on them like sampled tokens, with the rollout engine's log-probs of them (scored as prompt
tokens, temperature-scaled, SGLang's ``logprob_start_len``) as the ratio's denominator. So a forced
opening is weighted as if the policy had drawn it. That is biased on purpose: under its true sampling
odds (policy probability over forced share, ~0 at the start) a forced opening that pays would be
reinforced as slowly as sampling would have found it. The eval stage samples the policy alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ringzero.errors import RingzeroError
from ringzero.rl.seeds import derive_seed
from ringzero.rollout.types import Completion, GenerateRequest, LogprobRequest


@dataclass(frozen=True)
class Opening:
    ids: tuple[int, ...]
    samples: int  # of each prompt's samples, the last ``samples`` open with ``ids``
    # With guesses the forced samples are whole responses, the opening then one of these endings (an
    # answer and the stop) drawn uniformly, scored by the engine and never sampled: a policy that writes a
    # trace after any opening (as one that always thinks does) still gets its answer-now sample.
    guesses: tuple[tuple[int, ...], ...] | None = None
    # the tier tags (None: the prompt asked as is) whose prompts are forced; None: every prompt's
    tags: frozenset[str | None] | None = None

    def applies(self, problem) -> bool:
        return self.tags is None or problem.tier in self.tags

    def __post_init__(self) -> None:
        if not self.ids:
            raise RingzeroError("forced_opening.text: encodes to no tokens")
        if self.samples < 1:
            raise RingzeroError(f"forced_opening: at least one forced sample per prompt (got {self.samples})")
        if self.guesses is not None and not self.guesses:
            raise RingzeroError("forced_opening.answer guess: the task has no answers to guess from")


def forced_requests(req: GenerateRequest, opening: Opening) -> list[GenerateRequest]:
    """``req`` continued from the opening (``opening.samples`` samples, the opening's log-probs reported),
    or with guesses one scoring request per forced sample."""
    p = req.params
    logprobs = LogprobRequest(prompt_from=len(req.input_ids) - 1, prompt_temperature_scaled=True)
    rid = None if req.rid is None else f"{req.rid}/opening"
    if opening.guesses is not None:
        seed = derive_seed(0 if p.seed is None else p.seed, req.rid or "", "guess")
        picks = [opening.guesses[derive_seed(seed, j) % len(opening.guesses)] for j in range(opening.samples)]
        return [
            GenerateRequest(
                list(req.input_ids) + list(opening.ids) + list(g),
                replace(p, n=1, max_new_tokens=0),
                rid=rid,
                logprobs=logprobs,
                return_routed_experts=req.return_routed_experts,
            )
            for g in picks
        ]
    room = p.max_new_tokens - len(opening.ids)
    if room < 1:
        raise RingzeroError(
            f"forced_opening: the opening's {len(opening.ids)} tokens leave no room under "
            f"max_new_tokens ({p.max_new_tokens})"
        )
    seed = None if p.seed is None else derive_seed(p.seed, "opening")
    params = replace(p, n=opening.samples, max_new_tokens=room, seed=seed)
    return [
        GenerateRequest(
            list(req.input_ids) + list(opening.ids),
            params,
            rid=rid,
            logprobs=logprobs,
            return_routed_experts=req.return_routed_experts,
        )
    ]


def own_request(req: GenerateRequest, opening: Opening) -> GenerateRequest:
    """``req`` with the samples the policy writes alone."""
    own = req.params.n - opening.samples
    if own < 1:
        raise RingzeroError(
            f"forced_opening: {opening.samples} forced samples leave none of the prompt's "
            f"{req.params.n} to the policy"
        )
    return replace(req, params=replace(req.params, n=own))


def prefixed(c: Completion, prompt_len: int) -> tuple[list[int], list[float]]:
    """The response (forced tokens + continuation) and its rollout log-probs, the forced ones as the engine
    scored them."""
    forced = list(c.prompt_ids[prompt_len:])
    scored = (c.prompt_logprobs or [])[1:]
    if len(scored) != len(forced) or any(v is None for v in scored):
        raise RingzeroError(
            f"forced_opening: the rollout engine reported {len(scored)} log-probs for "
            f"{len(forced)} forced tokens (it must honour logprob_start_len)"
        )
    return forced + list(c.output_ids), [float(v) for v in scored] + list(c.output_logprobs)
