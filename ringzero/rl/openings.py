"""Forced openings: a share of each prompt's samples starts from a fixed prefix (AdaptThink's cold start).

Tier RL asks a policy that always thinks to learn when not to. Sampling alone never finds the short
answer once stage 1 and distillation have made thinking the only mode: the empty thought's first-token
probability is ~0, so no fast-tier group on a long item holds a within-budget sample to reinforce and
every such group's advantages are zero. AdaptThink (Zhang et al., 2025) forces the NoThinking opening
on part of the samples; here ``samples`` of each prompt's ``n`` open with ``ids`` (the empty thought
``<think> </think>`` by default) and the policy writes the rest.

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

    def __post_init__(self) -> None:
        if not self.ids:
            raise RingzeroError("forced_opening.text: encodes to no tokens")
        if self.samples < 1:
            raise RingzeroError(f"forced_opening: at least one forced sample per prompt (got {self.samples})")


def forced_request(req: GenerateRequest, opening: Opening) -> GenerateRequest:
    """``req`` continued from the opening: ``opening.samples`` samples, the opening's log-probs reported."""
    p = req.params
    room = p.max_new_tokens - len(opening.ids)
    if room < 1:
        raise RingzeroError(f"forced_opening: the opening's {len(opening.ids)} tokens leave no room under "
                            f"max_new_tokens ({p.max_new_tokens})")
    seed = None if p.seed is None else derive_seed(p.seed, "opening")
    params = replace(p, n=opening.samples, max_new_tokens=room, seed=seed)
    logprobs = LogprobRequest(prompt_from=len(req.input_ids) - 1, prompt_temperature_scaled=True)
    return GenerateRequest(list(req.input_ids) + list(opening.ids), params, rid=None if req.rid is None else
                           f"{req.rid}/opening", logprobs=logprobs, return_routed_experts=req.return_routed_experts)


def own_request(req: GenerateRequest, opening: Opening) -> GenerateRequest:
    """``req`` with the samples the policy writes alone."""
    own = req.params.n - opening.samples
    if own < 1:
        raise RingzeroError(f"forced_opening: {opening.samples} forced samples leave none of the prompt's "
                            f"{req.params.n} to the policy")
    return replace(req, params=replace(req.params, n=own))


def prefixed(c: Completion, opening: Opening) -> tuple[list[int], list[float]]:
    """The response (opening + continuation) and its rollout log-probs, the opening's as the engine scored them."""
    scored = (c.prompt_logprobs or [])[1:]
    if len(scored) != len(opening.ids) or any(v is None for v in scored):
        raise RingzeroError(f"forced_opening: the rollout engine reported {len(scored)} log-probs for an opening "
                            f"of {len(opening.ids)} tokens (it must honour logprob_start_len)")
    return list(opening.ids) + list(c.output_ids), [float(v) for v in scored] + list(c.output_logprobs)
