"""The embedded rollout engine: batched, cached generation in process, behind the ``RolloutClient`` protocol.

How a ``generate`` call runs:

1. every request expands into ``n`` rows (one per sample), each with its own generator: the request's
   ``seed`` mixed with the sample index, or a seed drawn from the engine's own stream when unset;
2. rows are cut into groups of at most ``max_batch``; per group, each distinct prompt is prefilled once
   (left-padded, optionally in chunks of ``prefill_chunk`` columns) and the cache fans out to the rows
   with ``cache.select`` (repeated indices), so n samples share one prefill;
3. decoding runs all rows of the group in lock step, one token per step from the decoding caches;
   rows that finish (stop id, stop string, length cap) are dropped from the cache at once, so they
   stop costing compute;
4. each completion carries its token ids, the log-prob of each token (``log_softmax(logits / T)`` before
   top-k/top-p, SGLang's convention) and a finish reason; and when its request asks
   (``GenerateRequest.logprobs``), the top-k alternatives of each step and the prompt's log-probs
   (see ``ringzero.rollout.engine.logprob_extras``).

``open_batch()`` is the other way in: a ``ContinuousBatch`` (``ringzero.rollout.engine.continuous``) that
requests join and leave between decoding steps, for servers whose requests arrive while others decode. It
shares the row setup, prefill, sampling and stop rules with ``generate``, so a seeded or greedy request gets
the same tokens either way.

A request with ``max_new_tokens == 0`` is not decoded at all: it finishes ``length`` with no output, and
serves to score its prompt. ``ignore_eos`` drops EOS and ``stop_token_ids`` from a row's stop ids (stop
strings still apply), as SGLang does. ``generate(..., abort=...)`` polls which requests the caller has
aborted, before each group's prefill and once per decoding step; their rows stop at once and finish
``abort`` with the tokens sampled so far (none when the group had not been prefilled yet).

The engine owns a copy of the weights cast to *its* precision policy, whatever the caller's model runs
under: the rollout side of the train/rollout gap.

``deterministic=True`` decodes through the trainer's forward instead of the cache
(``ringzero.rollout.engine.bitwise``): each row alone, each step one batch-invariant forward of the sequence
so far at the model's full context width, the forward ``score_sequences(..., batch_invariant=True)`` runs for
the trainer. The token is sampled (temperature / top-k / top-p, per-request seeded, as in normal mode) from
that forward's ``log_softmax(logits / T)``, and that same entry is the reported log-prob: the sampled
distribution, the reported one and the trainer's are one computation, so the importance ratio is exactly 1
when the trainer runs the same policy (dense models; MoE layers agree to rounding, see
``ringzero.model.scoring``). Nothing is rescored after the fact. The choice and its cost: the cached step
cannot be made bitwise equal to the parallel form here (other shapes, other last bits), and neither can the
parallel forward at the prefix's own length (a matmul's blocking follows its row count); the fixed width can.
It costs one full-context, unbatched forward per sampled token and row, with no cache:
``bench/bitwise_cost.py`` measures the tokens/s against normal mode. ``prefill_chunk`` and ``max_batch`` do
not change its numbers.

The engine lives on the device of its weights (``engine.device``): prompts are copied there once per
group, and the decoding loop keeps everything there (cache, sampling settings, each row's generator and
uniforms, stop ids, output buffers). Per step the host reads back at most one small tensor, the stop
check (which rows sampled a stop id, plus the tokens of rows with stop strings); finished outputs come
back once per group. A CUDA generator draws other streams than a CPU one seeded alike, so a seeded
request gives the same tokens on every run and in every batch on one device type, not across types.

``return_routed_experts`` (MoE models only): each asking row's ``Completion.routed_experts`` holds the experts
every fed token went to in the forwards that produced its tokens: the prefill's, then each decoding step's
(see ``ringzero.rollout.engine.routing_track``); under ``deterministic`` those of the batch-invariant forward
that fed each token (the prompt's: the first step's; each sampled token: the next step's). A prefill-only
request gets those of a prefill of its prompt. A row aborted before its prefill, or whose request did not ask,
gets None.

A sequence's total length (prompt + output) is capped at the model's ``max_position_embeddings``; a prompt
that leaves no room is refused (one that is only scored may fill the context).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

import torch

from ringzero.errors import RingzeroError
from ringzero.model.cache import left_padded
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import moe_layers
from ringzero.model.weights import copy_under_policy, load_weights_
from ringzero.rollout.engine import bitwise
from ringzero.rollout.engine.continuous import ContinuousBatch
from ringzero.rollout.engine.logprob_extras import TopKTrack, prompt_logprobs
from ringzero.rollout.engine.outcomes import ABORT, ABORTED, ABORTED_BEFORE_PREFILL, Done, completions, cut
from ringzero.rollout.engine.routing_track import GroupRouting, routing_shape, to_host
from ringzero.rollout.engine.rows import DecodingRows, Finished, RowSpec
from ringzero.rollout.engine.sampling import sample_next, sample_next_with_top, sample_seed
from ringzero.rollout.engine.stopping import LENGTH, StopStrings
from ringzero.rollout.types import Completion, GenerateRequest
from ringzero.tokenizer.base import Tokenizer

DEFAULT_MAX_BATCH = 64
DEFAULT_COMPACT_BELOW = 0.5

AbortCheck = Callable[[], Collection[int]]
"""Returns the indices of the requests aborted so far; polled per decoding step, so it must be cheap.
The engine re-reads its answer only when a different object comes back."""

_NONE_ABORTED: frozenset[int] = frozenset()


def _never() -> frozenset[int]:
    return _NONE_ABORTED


class EmbeddedEngine:
    """In-process ``RolloutClient``: ``generate``, ``update_weights[_from_disk]``, ``health``.

    ``model``: the weights to serve (copied, cast to ``policy``; default the model's own policy).
    ``tokenizer``: needed for stop strings; its ``eos_id`` always stops a row and its ``pad_id`` pads
    prompts. Without one, only ``stop_token_ids`` and the length cap stop a row.
    ``max_batch``: rows decoded together. ``prefill_chunk``: columns per prefill forward (None = all).
    ``seed``: the stream that seeds requests sent without a ``seed``.
    ``compact_below``: a continuous batch (``open_batch``) rewrites its cache down to its live rows once
    they fill less than this fraction of its slots; until then finished rows' slots wait for newcomers.
    """

    def __init__(
        self,
        model: HybridLM,
        tokenizer: Tokenizer | None = None,
        policy: PrecisionPolicy | None = None,
        *,
        deterministic: bool = False,
        max_batch: int = DEFAULT_MAX_BATCH,
        prefill_chunk: int | None = None,
        weight_version: str = "0",
        seed: int = 0,
        s3=None,
        compact_below: float = DEFAULT_COMPACT_BELOW,
    ):
        if max_batch < 1:
            raise RingzeroError(f"max_batch must be >= 1 (got {max_batch})")
        if not 0 <= compact_below <= 1:
            raise RingzeroError(f"compact_below must be in [0, 1] (got {compact_below})")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise RingzeroError(f"prefill_chunk must be >= 1 or None (got {prefill_chunk})")
        self.policy = policy or model.policy
        self.model = copy_under_policy(model, self.policy).eval()
        self.tokenizer = tokenizer
        self.deterministic = deterministic
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.weight_version = str(weight_version)
        self.s3 = s3
        self.seed = seed
        self._seeds = random.Random(seed)
        self.compact_below = compact_below

    # -- RolloutClient ----------------------------------------------------------------------------

    def health(self) -> bool:
        return True

    def generate(
        self,
        requests: Sequence[GenerateRequest],
        *,
        abort: AbortCheck | None = None,
    ) -> list[list[Completion]]:
        """``n`` completions per request, in request order (``abort``: see the module docstring)."""
        rows = self._rows(requests)
        done: list[Done | None] = [None] * len(rows)
        decoded = []
        for j, row in enumerate(rows):
            if row.max_new == 0:  # prefill-only: the prompt is scored below, nothing is decoded
                done[j] = Done(Finished([], [], LENGTH, None))
            else:
                decoded.append(j)
        with torch.inference_mode():
            for start in range(0, len(decoded), self.max_batch):
                group = decoded[start : start + self.max_batch]
                results = self._run_group([rows[j] for j in group], abort or _never)
                for j, d in zip(group, results, strict=True):
                    done[j] = d
            if any(r.routed for r in rows):
                self._route_prompts(rows, done)
            queued = {
                r.request
                for r, d in zip(rows, done, strict=True)
                if d.abort_message == ABORTED_BEFORE_PREFILL
            }
            wanted = [
                i
                for i, req in enumerate(requests)
                if req.logprobs.prompt_from is not None and i not in queued
            ]
            prompts = prompt_logprobs(
                self.model, requests, wanted, deterministic=self.deterministic, pad_id=self.pad_id
            )
        experts = to_host(
            [d.routing if r.routed else None for d, r in zip(done, rows, strict=True)],
            [i for i, _ in moe_layers(self.model)],
            self.model.cfg.num_hidden_layers,
        )
        return completions(requests, rows, done, prompts, experts, self.weight_version)

    def continuous_ok(self, requests: Sequence[GenerateRequest]) -> bool:
        """Whether ``requests`` can join a continuous batch: what it does not track runs through ``generate``.

        Batch-invariant mode decodes each row alone anyway; per-step top-k alternatives and routed experts
        are kept per static group only.
        """
        return not self.deterministic and all(
            not r.return_routed_experts and not r.logprobs.top_k for r in requests
        )

    def open_batch(self, compact_below: float | None = None) -> ContinuousBatch:
        """A ``ContinuousBatch`` on this engine: requests join and leave it between decoding steps."""
        return ContinuousBatch(self, self.compact_below if compact_below is None else compact_below)

    def update_weights(self, state_dict: dict[str, torch.Tensor], weight_version: str) -> None:
        """Copy new weights in (cast to this engine's policy); later generations report ``weight_version``."""
        load_weights_(self.model, state_dict, source=f"update_weights({weight_version!r})")
        self.weight_version = str(weight_version)

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        """Load new weights of the served architecture: a local Ling 2.5 model folder (a path, what SGLang's
        ``model_path`` is) or a committed checkpoint in the store (a ``file://`` or ``s3://`` URI)."""
        from ringzero.model.checkpoint import load_model
        from ringzero.model.hf_folder import load_folder

        if "://" in uri:
            loaded = load_model(uri, self.policy, s3=self.s3, device=self.device)
        else:
            loaded = load_folder(uri, self.policy, device=self.device)
        if loaded.config != self.model.cfg:
            raise RingzeroError(f"{uri}: its model config differs from the one this engine serves")
        self.model = loaded.model.eval()
        self.weight_version = str(weight_version)

    # -- internals -----------------------------------------------------------------------------

    def _rows(self, requests: Sequence[GenerateRequest]) -> list[RowSpec]:
        """One row per sample, with its generator seed, length cap and stop ids; bad requests refused."""
        rows = []
        eos = {self.tokenizer.eos_id} if self.tokenizer is not None else set()
        for i, req in enumerate(requests):
            prompt, p = self._checked_prompt(i, req), req.params
            if req.return_routed_experts and self.routing_shape is None:
                raise RingzeroError(
                    f"request {i}: return_routed_experts needs a model with MoE layers; the "
                    "served model has none"
                )
            StopStrings(p.stop, self.tokenizer)  # refuse bad stop strings before any work
            base = p.seed if p.seed is not None else self._seeds.getrandbits(62)
            room = self.model.cfg.max_position_embeddings - len(prompt)
            stop_ids = () if p.ignore_eos else tuple(sorted(set(p.stop_token_ids) | eos))
            rows += [
                RowSpec(
                    i,
                    prompt,
                    p,
                    sample_seed(base, k),
                    min(p.max_new_tokens, room),
                    stop_ids,
                    req.rid,
                    top_k=req.logprobs.top_k,
                    routed=req.return_routed_experts,
                )
                for k in range(p.n)
            ]
        return rows

    def _checked_prompt(self, i: int, req: GenerateRequest) -> list[int]:
        vocab, limit = self.model.cfg.vocab_size, self.model.cfg.max_position_embeddings
        prompt = [int(t) for t in req.input_ids]
        if not prompt:
            raise RingzeroError(f"request {i}: input_ids is empty; a prompt needs at least one token")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise RingzeroError(f"request {i}: token ids {bad[:5]} outside the vocabulary of {vocab}")
        # A prompt that is only scored (max_new_tokens 0) may fill the context; one to continue must leave
        # room.
        if len(prompt) + (req.params.max_new_tokens > 0) > limit:
            raise RingzeroError(
                f"request {i}: a prompt of {len(prompt)} tokens leaves no room under "
                f"max_position_embeddings {limit}"
            )
        lp, room = req.logprobs, len(prompt) - (req.params.max_new_tokens > 0)
        if lp.prompt_from is not None and not 0 <= lp.prompt_from <= room:
            raise RingzeroError(
                f"request {i}: prompt log-probs from position {lp.prompt_from}, outside "
                f"0..{room} for a prompt of {len(prompt)} tokens"
            )
        if not 0 <= lp.top_k <= vocab:
            raise RingzeroError(f"request {i}: top-k log-probs of {lp.top_k} tokens, outside 0..{vocab}")
        return prompt

    @property
    def context_length(self) -> int:
        """Tokens a sequence (prompt + output) may hold."""
        return self.model.cfg.max_position_embeddings

    @property
    def max_total_num_tokens(self) -> int:
        """Tokens the engine holds at once (SGLang's name for its KV pool size): ``max_batch`` rows of
        ``context_length`` positions each, the most one decoding batch's cache can hold."""
        return self.max_batch * self.context_length

    @property
    def routing_shape(self) -> tuple[int, int] | None:
        """``(num_hidden_layers, num_experts_per_tok)`` of ``routed_experts``; None: a dense model, no
        experts."""
        return routing_shape(self.model)

    @property
    def pad_id(self) -> int:
        """What prompts are left-padded with: the tokenizer's pad id, 0 without a tokenizer."""
        return self.tokenizer.pad_id if self.tokenizer is not None else 0

    @property
    def device(self) -> torch.device:
        """Where the engine's weights live, and with them every tensor of its decoding loop."""
        return next(self.model.parameters()).device

    def _prefill(self, prompts: list[list[int]], capacity: int):
        """Last-position logits ``[P, V]`` of each prompt and the cache holding them."""
        ids_PT, pos_PT = left_padded(prompts, self.pad_id, self.device)
        cache = self.model.new_cache(len(prompts), capacity=capacity)
        chunk = self.prefill_chunk or ids_PT.shape[1]
        for s in range(0, ids_PT.shape[1], chunk):
            hidden_PSD = self.model.hidden(ids_PT[:, s : s + chunk], pos_PT[:, s : s + chunk], cache)
        # Only the last column's logits are needed: skip the LM head on the rest of the prompt.
        return self.model.logits(hidden_PSD[:, -1:])[:, 0], cache

    def _run_group(self, rows: list[RowSpec], aborted: AbortCheck) -> list[Done]:
        """Decode a group; rows whose request is aborted already finish without a prefill."""
        seen = aborted()
        live = [b for b, r in enumerate(rows) if r.request not in seen]
        done = {
            b: Done(Finished([], [], ABORT, None), abort_message=ABORTED_BEFORE_PREFILL)
            for b, r in enumerate(rows)
            if r.request in seen
        }
        if live and self.deterministic:
            decoded = [
                Done(
                    d.result,
                    d.top,
                    ABORTED if d.capped and cut(d.result, rows[b]) else None,
                    d.routing if rows[b].routed else None,
                )
                for b, d in zip(
                    live,
                    bitwise.decode(
                        self.model, [rows[b] for b in live], aborted, seen, self.tokenizer, self.pad_id
                    ),
                    strict=True,
                )
            ]
            for b, d in zip(live, decoded, strict=True):
                done[b] = d
        elif live:
            decoded = self._decode([rows[b] for b in live], aborted, seen)
            for b, d in zip(live, decoded, strict=True):
                done[b] = d
        return [done[b] for b in range(len(rows))]

    def _decode(self, rows: list[RowSpec], aborted: AbortCheck, seen) -> list[Done]:
        """Prefill each distinct prompt once, fan out to the rows, decode until every row finished.

        Everything stays on the engine's device; per step at most one small read comes back to the
        host, the stop check of ``DecodingRows.advance``; the outputs (and top-k alternatives) come
        back once, at the end. ``seen`` is the abort check's last answer.
        """
        first_row_of: dict[int, int] = {}
        for r in rows:
            first_row_of.setdefault(r.request, len(first_row_of))
        prompts = list({r.request: r.prompt for r in rows}.values())
        state = DecodingRows(rows, self.tokenizer, self.device)
        top_k = max(r.top_k for r in rows)
        track = TopKTrack(len(rows), state.steps, top_k, self.device) if top_k else None
        routing = GroupRouting(self.model, len(rows), self.device, enabled=any(r.routed for r in rows))
        with routing.prefill([len(p) for p in prompts]):
            logits_BV, cache = self._prefill(prompts, max(len(p) for p in prompts) + state.steps)
        fan_out_B = torch.tensor(
            [first_row_of[r.request] for r in rows], dtype=torch.long, device=self.device
        )
        cache.select(fan_out_B, check=False)  # built from the prompts just prefilled: in range
        logits_BV = logits_BV[fan_out_B]
        capped: set[int] = set()
        for t in range(state.steps):
            if track is None:
                tokens_B, logp_B = sample_next(logits_BV, state.settings, state.uniforms.next())
            else:
                tokens_B, logp_B, top = sample_next_with_top(
                    logits_BV, state.settings, state.uniforms.next(), track.k
                )
                track.record(t, *top)
            now = aborted()
            if now is not seen:  # the caller aborted requests: their rows end with this step's token
                seen = now
                for b, r in enumerate(rows):
                    if r.request in now and b not in capped:
                        capped.add(b)
                        state.cap(b, t + 1)
            # The step's one host read (none when no live row can stop on a token): which rows finished sets
            # the next forward's row count, a shape the host must know before launching it. Deferring the read
            # by a step would decode finished rows once more, and MoE rows' rounding follows their batch.
            keep_B = state.advance(t, tokens_B, logp_B)
            if keep_B is not None:  # some rows finished: stop paying for them
                if keep_B.numel() == 0:
                    break
                cache.select(keep_B, check=False)  # live rows of this cache, by construction
                tokens_B = tokens_B[keep_B]
                if track is not None:
                    track.select(keep_B)
                routing.select(keep_B)
            with routing.step():
                logits_BV = self.model(tokens_B[:, None], cache=cache)[:, -1]
        results = state.results()
        experts: list[torch.Tensor | None] = [None] * len(rows)
        if routing.enabled:  # every fed token: the prompt's, then each output token but the last
            experts = routing.rows(
                [first_row_of[r.request] for r in rows], [len(f.output_ids) - 1 for f in results]
            )
        out = []
        for b, (f, routes, row) in enumerate(zip(results, experts, rows, strict=True)):
            top = track.pairs(b, len(f.output_ids), row.top_k) if track is not None and row.top_k else None
            d = Done(f, top)
            if b in capped and cut(f, row):
                d.abort_message = ABORTED
            d.routing = routes if row.routed else None
            out.append(d)
        return out

    def _route_prompts(self, rows: list[RowSpec], done: list[Done]) -> None:
        """Prefill-only rows that ask: the experts of their prompts' tokens but the last, from a prefill."""
        todo = [j for j, r in enumerate(rows) if r.routed and r.max_new == 0]
        if self.deterministic:
            for j in todo:
                done[j].routing = bitwise.route_prompt(self.model, rows[j].prompt, self.pad_id)
            return
        for start in range(0, len(todo), self.max_batch):
            group = todo[start : start + self.max_batch]
            prompts = [rows[j].prompt for j in group]
            routing = GroupRouting(self.model, len(group), self.device)
            with routing.prefill([len(p) for p in prompts]):
                self._prefill(prompts, max(len(p) for p in prompts))
            for j, experts in zip(group, routing.rows(range(len(group)), [0] * len(group)), strict=True):
                done[j].routing = experts[:-1]
