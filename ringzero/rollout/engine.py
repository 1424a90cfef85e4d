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
   top-k/top-p, SGLang's convention) and a finish reason.

The engine owns a copy of the weights cast to *its* precision policy, whatever the caller's model runs
under: the rollout side of the train/rollout gap. Under ``deterministic=True`` the reported log-probs
are not the decoding ones but ``score_sequences(..., batch_invariant=True)`` on the finished sequences,
the function the trainer calls for the numerator, so the importance ratio is exactly 1 when the trainer
runs the same policy (see ``ringzero.rollout.scoring``).

A sequence's total length (prompt + output) is capped at the model's ``max_seq_len``; a prompt that
leaves no room is refused.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringzero.errors import RingzeroError
from ringzero.model.cache import left_padded
from ringzero.model.config import PrecisionPolicy
from ringzero.model.hybrid import HybridLM
from ringzero.rollout.sampling import RowSettings, UniformStream, sample_next, sample_seed
from ringzero.rollout.scoring import score_sequences
from ringzero.rollout.stopping import LENGTH, STOP, StopStrings, StopTable
from ringzero.rollout.types import Completion, GenerateRequest
from ringzero.rollout.weights import copy_under_policy, load_weights_
from ringzero.tokenizer.base import Tokenizer

DEFAULT_MAX_BATCH = 64


@dataclass
class _Row:
    """One sample to generate: request index, sample index, its prompt, settings and generator seed."""

    request: int
    prompt: list[int]
    request_obj: GenerateRequest
    seed: int
    max_new: int


@dataclass
class _Finished:
    output_ids: list[int]
    logprobs: list[float]
    reason: str
    matched: int | str | None


class EmbeddedEngine:
    """In-process ``RolloutClient``: ``generate``, ``update_weights[_from_disk]``, ``health``.

    ``model``: the weights to serve (copied, cast to ``policy``; default the model's own policy).
    ``tokenizer``: needed for stop strings; its ``eos_id`` always stops a row and its ``pad_id`` pads
    prompts. Without one, only ``stop_token_ids`` and the length cap stop a row.
    ``max_batch``: rows decoded together. ``prefill_chunk``: columns per prefill forward (None = all).
    ``seed``: the stream that seeds requests sent without a ``seed``.
    """

    def __init__(self, model: HybridLM, tokenizer: Tokenizer | None = None, policy: PrecisionPolicy | None = None,
                 *, deterministic: bool = False, max_batch: int = DEFAULT_MAX_BATCH,
                 prefill_chunk: int | None = None, weight_version: str = "0", seed: int = 0, s3=None):
        if max_batch < 1:
            raise RingzeroError(f"max_batch must be >= 1 (got {max_batch})")
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
        self._seeds = random.Random(seed)

    # -- RolloutClient ----------------------------------------------------------------------------

    def health(self) -> bool:
        return True

    def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        """``n`` completions per request, in request order."""
        rows = self._rows(requests)
        finished: list[_Finished] = []
        with torch.inference_mode():
            for start in range(0, len(rows), self.max_batch):
                finished += self._run_group(rows[start:start + self.max_batch])
            if self.deterministic:
                self._rescore(rows, finished)
        out: list[list[Completion]] = [[] for _ in requests]
        for row, done in zip(rows, finished, strict=True):
            meta = {"rid": row.request_obj.rid} if row.request_obj.rid is not None else {}
            out[row.request].append(Completion(
                prompt_ids=list(row.prompt), output_ids=done.output_ids, output_logprobs=done.logprobs,
                finish_reason=done.reason, matched_stop=done.matched, weight_version=self.weight_version,
                meta=meta,
            ))
        return out

    def update_weights(self, state_dict: dict[str, torch.Tensor], weight_version: str) -> None:
        """Copy new weights in (cast to this engine's policy); later generations report ``weight_version``."""
        load_weights_(self.model, state_dict, source=f"update_weights({weight_version!r})")
        self.weight_version = str(weight_version)

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        """Load a committed checkpoint (same architecture as the served model) through the store."""
        from ringzero.model.checkpoint import load_model

        loaded = load_model(uri, self.policy, s3=self.s3, device=self.model.embed.weight.device)
        if loaded.config != self.model.cfg:
            raise RingzeroError(f"{uri}: its model config differs from the one this engine serves")
        self.model = loaded.model.eval()
        self.weight_version = str(weight_version)

    # -- internals -----------------------------------------------------------------------------

    def _rows(self, requests: Sequence[GenerateRequest]) -> list[_Row]:
        vocab, limit = self.model.cfg.vocab_size, self.model.cfg.max_seq_len
        rows = []
        for i, req in enumerate(requests):
            prompt = [int(t) for t in req.input_ids]
            if not prompt:
                raise RingzeroError(f"request {i}: input_ids is empty; a prompt needs at least one token")
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise RingzeroError(f"request {i}: token ids {bad[:5]} outside the vocabulary of {vocab}")
            room = limit - len(prompt)
            if room < 1:
                raise RingzeroError(f"request {i}: a prompt of {len(prompt)} tokens leaves no room under "
                                    f"max_seq_len {limit}")
            p = req.params
            StopStrings(p.stop, self.tokenizer)  # refuse bad stop strings before any work
            base = p.seed if p.seed is not None else self._seeds.getrandbits(62)
            rows += [_Row(i, prompt, req, sample_seed(base, k), min(p.max_new_tokens, room)) for k in range(p.n)]
        return rows

    def _stop_ids(self, row: _Row) -> list[int]:
        ids = set(row.request_obj.params.stop_token_ids)
        if self.tokenizer is not None:
            ids.add(self.tokenizer.eos_id)
        return sorted(ids)

    def _prefill(self, prompts: list[list[int]], capacity: int):
        """Last-position logits ``[P, V]`` of each prompt and the cache holding them."""
        pad = self.tokenizer.pad_id if self.tokenizer is not None else 0
        device = self.model.embed.weight.device
        ids_PT, pos_PT = left_padded(prompts, pad, device)
        cache = self.model.new_cache(len(prompts), capacity=capacity)
        chunk = self.prefill_chunk or ids_PT.shape[1]
        for s in range(0, ids_PT.shape[1], chunk):
            hidden_PSD = self.model.hidden(ids_PT[:, s:s + chunk], pos_PT[:, s:s + chunk], cache)
        # Only the last column's logits are needed: skip the LM head on the rest of the prompt.
        return self.model.logits(hidden_PSD[:, -1:])[:, 0], cache

    def _run_group(self, rows: list[_Row]) -> list[_Finished]:
        first_row_of: dict[int, int] = {}
        prompts = []
        for r in rows:
            if r.request not in first_row_of:
                first_row_of[r.request] = len(prompts)
                prompts.append(r.prompt)
        steps = max(r.max_new for r in rows)
        logits_BV, cache = self._prefill(prompts, max(len(p) for p in prompts) + steps)
        fan_out_B = torch.tensor([first_row_of[r.request] for r in rows], device=logits_BV.device)
        cache.select(fan_out_B)
        logits_BV = logits_BV[fan_out_B]

        params = [r.request_obj.params for r in rows]
        settings = RowSettings.build([p.temperature for p in params], [p.top_k for p in params],
                                     [p.top_p for p in params], [r.seed for r in rows])
        uniforms = UniformStream(settings)
        table = StopTable([self._stop_ids(r) for r in rows], [r.max_new for r in rows])
        strings = [StopStrings(p.stop, self.tokenizer) if p.stop else None for p in params]
        ids_BT = torch.zeros((len(rows), steps), dtype=torch.long)
        logp_BT = torch.zeros((len(rows), steps), dtype=torch.float64)
        alive_B = torch.arange(len(rows))  # original row of each cache row
        results: list[_Finished | None] = [None] * len(rows)

        device = logits_BV.device
        string_rows = {row for row, s in enumerate(strings) if s is not None}
        for t in range(steps):
            tokens_B, logp_B = sample_next(logits_BV, settings, uniforms.next())
            tokens_B = tokens_B.cpu()
            ids_BT[alive_B, t] = tokens_B
            logp_BT[alive_B, t] = logp_B.to(device="cpu", dtype=torch.float64)
            by_id_B, by_len_B = table.hit_stop_id(tokens_B), table.at_length(t + 1)
            matched_string = {}
            if string_rows:  # the only per-row Python work of a step, and only for rows with stop strings
                for b, row in enumerate(alive_B.tolist()):
                    if row in string_rows and not by_id_B[b]:
                        matched_string[b] = strings[row].match(ids_BT[row, : t + 1].tolist())
            done_B = by_id_B | by_len_B
            for b, s in matched_string.items():
                done_B[b] |= s is not None
            if not bool(done_B.any()):
                logits_BV = self.model(tokens_B[:, None].to(device), cache=cache)[:, -1]
                continue
            for b in done_B.nonzero()[:, 0].tolist():
                row = int(alive_B[b])
                if by_id_B[b]:
                    reason, matched = STOP, int(tokens_B[b])
                elif matched_string.get(b) is not None:
                    reason, matched = STOP, matched_string[b]
                else:
                    reason, matched = LENGTH, None
                results[row] = _Finished(ids_BT[row, : t + 1].tolist(), logp_BT[row, : t + 1].tolist(),
                                         reason, matched)
            keep_B = (~done_B).nonzero()[:, 0]
            if keep_B.numel() == 0:
                break
            cache.select(keep_B)
            settings = settings.select(keep_B)
            uniforms.select(keep_B, settings)
            table.select(keep_B)
            alive_B, tokens_B = alive_B[keep_B], tokens_B[keep_B]
            logits_BV = self.model(tokens_B[:, None].to(device), cache=cache)[:, -1]
        return results

    def _rescore(self, rows: list[_Row], finished: list[_Finished]) -> None:
        """Deterministic mode: replace decoding log-probs with the trainer's batch-invariant scoring."""
        for row, done in zip(rows, finished, strict=True):
            (logp,) = score_sequences(self.model, [row.prompt + done.output_ids], [len(row.prompt)],
                                      row.request_obj.params.temperature, batch_invariant=True)
            done.logprobs = logp.double().tolist()


InProcessClient = EmbeddedEngine
"""The embedded engine is the in-process ``RolloutClient``."""
