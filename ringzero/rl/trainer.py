"""Minibatch policy updates over one rollout batch: the numerator, the objective, guarded optimizer steps.

Per minibatch (the paper's 512 / 32 shape, ``minibatches`` updates per rollout batch):

1. ``logp_train``: the TRAINING model's log-probs of the sampled tokens under its current weights,
   from ``score_sequences`` (the one scoring function; with ``batch_invariant`` it is bitwise the one
   a deterministic rollout engine reported). Never a cached inference value;
2. ``objective``: the stage's policy loss against the rollout log-probs (the denominator) plus k3 KL
   to the frozen reference, reduced by the stage's normalization;
3. backward and one optimizer step; a non-finite loss or gradient norm never reaches the weights
   (the step is skipped and counted in ``loss/skipped``).

With ``loss.corrections`` (``ringzero.rl.corrections``), ``correct(batch)`` first scores the whole batch
once without gradient under the sampling weights (logp_old); the corrections' weights and masks come from
logp_old vs the rollout log-probs, and ``train(..., correction=...)`` hands each minibatch its rows: the
policy ratio's denominator becomes logp_old, weights multiply the per-token loss, dropped tokens leave it.

The first minibatch sees the weights the rollout engine sampled with, so its ratio shows the engine
gap alone (exactly 1 with identical numerics in deterministic mode); later minibatches add staleness,
which is where the clip starts to act. The ratio-tail (``ratio/*``, ``logratio/*``, ``drift/*``) and
``mismatch/*`` metrics are taken over the whole batch, each token at the moment its minibatch was scored;
the same statistics of the first minibatch alone, the engine gap without staleness, go under ``gap/*``
(from that minibatch's own forward: no extra one). Gates and stop conditions read ``gap/*``.

Across ranks (``runtime``): every rank holds the whole rollout batch; each minibatch's rows are split
over the data-parallel replicas, and each row's tokens over the context-parallel ranks of a replica
(``ringzero.parallel.token_shards``, global positions). The loss of a shard is divided by the global
denominator (token-level: the constant; sample-level: each sequence's full length and the minibatch's
full sequence count), so the gradients summed over ``dp x cp`` are those of one process. Each
micro-batch of ``micro_batch`` rows runs forward and backward on its own, so no graph outlives it.
Per-token values (log-probs, reference log-probs, entropy) are summed into the global ``[N, T]`` grid
on every rank, so the ratio tail and every metric are taken over the whole token population, never
averaged over ranks.

Letter legend: N responses in the rollout batch, M responses in a minibatch, m in a micro-batch,
T response positions, W input columns.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from ringzero.model.hybrid import HybridLM
from ringzero.model.routing import moe_layers, replay_routing
from ringzero.model.scoring import score_tokens
from ringzero.parallel.micro_batches import MicroBatch, run_micro_batches
from ringzero.parallel.runtime import Runtime, single
from ringzero.parallel.token_shards import logprobs_from_hidden, pad_rows, shard_tokens
from ringzero.rl.corrections.compose import BatchCorrection, apply_corrections
from ringzero.rl.losses.normalization import Normalization
from ringzero.rl.mismatch_metrics import mismatch_metrics
from ringzero.rl.objective import make_normalization, objective
from ringzero.rl.rollout_batch import RolloutBatch
from ringzero.rl.tail_metrics import entropy_summary, kl_summary, ratio_tail

DEFAULT_MICRO_BATCH = 16


def padded(logps: list[torch.Tensor], width: int) -> torch.Tensor:
    """Stack per-sequence log-probs into ``[M, width]`` (zeros after each row's end), keeping gradients."""
    rows = [torch.nn.functional.pad(lp, (0, width - lp.shape[0])) for lp in logps]
    return torch.stack(rows) if rows else torch.zeros((0, width))


def response_view(grid_mW: torch.Tensor, prompt_lens_m: torch.Tensor, T: int) -> torch.Tensor:
    """``[m, T]``: response token t of row i is predicted at input column ``prompt_len_i - 1 + t``."""
    W = grid_mW.shape[1]
    col_mT = (prompt_lens_m - 1)[:, None] + torch.arange(T, device=grid_mW.device)[None, :]
    inside_mT = col_mT < W
    values = grid_mW.gather(1, col_mT.clamp(max=W - 1))
    return torch.where(inside_mT, values, torch.zeros_like(values))


class PolicyTrainer:
    """``train(batch, advantages_N, seed)`` -> metrics; owns no weights, only how they are updated.

    ``optimizer`` is a ``ringzero.engines.optimizer.TrainOptimizer`` (or anything with ``zero_grad``,
    ``step() -> report(lr, grad_norm, skipped)``). ``reference`` is the frozen KL reference model
    (needed when ``loss.kl_coef > 0``). ``model`` and ``reference`` must already be parallelized for
    ``runtime`` (``ringzero.parallel.parallelize``) when its cp degree is above 1.
    """

    def __init__(
        self,
        model: HybridLM,
        optimizer,
        loss,
        *,
        minibatches: int,
        max_new_tokens: int,
        temperature: float,
        reference: HybridLM | None = None,
        batch_invariant: bool = False,
        pad_id: int = 0,
        runtime: Runtime | None = None,
        sharding: str = "contiguous",
        micro_batch: int = DEFAULT_MICRO_BATCH,
    ):
        if loss.kl_coef > 0 and reference is None:
            raise ValueError("loss.kl_coef > 0 needs a reference model")
        self.runtime = runtime or single(model.word_embeddings.weight.device)
        if batch_invariant and self.runtime.dims.cp > 1:
            raise ValueError("batch_invariant scoring needs cp = 1: a sharded forward sums in another order")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.minibatches, self.max_new_tokens, self.temperature = minibatches, max_new_tokens, temperature
        self.reference, self.batch_invariant, self.pad_id = reference, batch_invariant, pad_id
        self.sharding, self.micro_batch = sharding, max(1, micro_batch)
        self.routing_replay = bool(getattr(loss, "routing_replay", False))
        if self.routing_replay and batch_invariant:
            raise ValueError(
                "routing_replay with batch-invariant scoring: the deterministic engine already routes "
                "every token as the trainer does"
            )
        if self.routing_replay and not moe_layers(model):
            raise ValueError("routing_replay needs a model with MoE layers (num_experts is null)")

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def score(
        self, model: HybridLM, batch: RolloutBatch, rows: list[int], T: int, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(logp_mT, owned_mT, entropy_mT)`` of ``rows``: this rank's tokens of them (zeros elsewhere)."""
        return self.score_many(model, batch, [rows], T, with_entropy)[0]

    def score_many(
        self,
        model,
        batch: RolloutBatch,
        groups: list[list[int]],
        T: int,
        with_entropy: bool = False,
        then=None,
    ) -> list:
        """``score`` of each group of rows, one micro-batch each; with ``then``, micro-batch ``i``'s scores go
        through ``then(i, scores) -> (loss, record)`` and the losses are backpropagated. Under pipeline
        parallelism the records of stages other than the last are None."""
        t = self.temperature if self.temperature > 0 else 1.0
        if self.batch_invariant:  # each row alone, unpadded: bitwise the deterministic engine's numbers
            records = []
            for i, rows in enumerate(groups):
                sequences, prompt_lens = batch.sequences(rows)
                # The entropy comes from the logits of the same forward, never from a second one.
                scored = score_tokens(
                    model, sequences, prompt_lens, t, True, pad_id=self.pad_id, with_entropy=with_entropy
                )
                logp_mT = padded([s.logprobs for s in scored], T)
                ent_mT = padded([s.entropy for s in scored], T) if with_entropy else None
                scores = (logp_mT, torch.ones_like(logp_mT, dtype=torch.bool), ent_mT)
                loss, record = (None, scores) if then is None else then(i, scores)
                if loss is not None:
                    loss.backward()
                records.append(record)
            return records
        # routing replay: the frozen reference routes on its own
        replay = self.routing_replay and model is self.model
        micro = [
            self._micro_batch(
                model,
                batch,
                rows,
                T,
                t,
                with_entropy,
                replay,
                None if then is None else (lambda scores, i=i: then(i, scores)),
            )
            for i, rows in enumerate(groups)
        ]
        return run_micro_batches(model, micro, backward=then is not None)

    def _micro_batch(self, model, batch, rows, T, t, with_entropy, replay, then) -> MicroBatch:
        sequences, prompt_lens = batch.sequences(rows)
        ids_mL = pad_rows(sequences, self.pad_id, self.device)
        shard = shard_tokens(ids_mL, self.runtime, self.sharding)
        plens_m = torch.tensor(prompt_lens, dtype=torch.long, device=self.device)
        context = None
        if replay:
            experts = [batch.routed_experts[i] for i in rows]
            context = lambda: replay_routing(model, replay_experts(model, experts, shard))  # noqa: E731

        def head(hidden_BSD):
            logp_mS, ent_mS = logprobs_from_hidden(
                model, shard, hidden_BSD, t, first_column=min(prompt_lens) - 1, with_entropy=with_entropy
            )
            logp_mT = response_view(shard.to_grid(logp_mS), plens_m, T)
            ent_mT = None if ent_mS is None else response_view(shard.to_grid(ent_mS), plens_m, T)
            owned_mT = response_view(shard.to_grid(torch.ones_like(logp_mS)), plens_m, T) > 0
            scores = (logp_mT, owned_mT, ent_mT)
            return (None, scores) if then is None else then(scores)

        return MicroBatch(shard, head, context)

    def minibatch_rows(self, n: int, seed: int) -> list[list[int]]:
        """A seeded shuffle cut into ``minibatches`` equal parts: groups are spread over the updates."""
        if n % self.minibatches:
            raise ValueError(f"minibatches ({self.minibatches}) must divide the batch of {n} responses")
        order = list(range(n))
        random.Random(seed).shuffle(order)
        size = n // self.minibatches
        return [sorted(order[i : i + size]) for i in range(0, n, size)]

    def correct(self, batch: RolloutBatch) -> BatchCorrection | None:
        """The stage's corrections of ``batch`` (None when it lists none): call before the advantages, whose
        group baselines must leave out the responses it drops (``keep_N``), and pass it to ``train``.

        logp_old is scored like the minibatches (rows over dp, tokens over cp, micro-batch by micro-batch,
        summed into the global grid), without gradient, before any update of this step."""
        if not getattr(self.loss, "corrections", None):
            return None
        mask_NT = batch.mask_NT
        N, T = mask_NT.shape
        logp_old_NT = torch.zeros((N, T), dtype=torch.float32, device=self.device)
        mine = list(range(N))[self.runtime.dp_slice(N)]
        groups = [mine[start : start + self.micro_batch] for start in range(0, len(mine), self.micro_batch)]
        self.model.train()
        with torch.no_grad():
            for rows_m, scores in zip(groups, self.score_many(self.model, batch, groups, T), strict=True):
                if scores is None:  # a pipeline stage other than the last: the sum brings the values
                    continue
                logp_mT, owned_mT, _ = scores
                at = torch.tensor(rows_m, device=self.device)
                logp_old_NT[at] = logp_mT.float() * (mask_NT[at] & owned_mT).to(torch.float32)
        self.runtime.sum_(logp_old_NT)
        return apply_corrections(self.loss.corrections, logp_old_NT, batch.logp_rollout_NT, mask_NT)

    def train(
        self,
        batch: RolloutBatch,
        advantages_N: torch.Tensor,
        seed: int,
        correction: BatchCorrection | None = None,
    ) -> dict[str, float]:
        if getattr(self.loss, "corrections", None) and correction is None:
            raise ValueError(
                "loss.corrections is set: pass correction=trainer.correct(batch), computed before the "
                "advantages so that dropped responses stay out of the group baselines"
            )
        dev, rt = self.device, self.runtime
        mask_NT, logp_rollout_NT = batch.mask_NT, batch.logp_rollout_NT  # made on this device by collect()
        N, T = mask_NT.shape
        logp_train_NT = torch.zeros((N, T), dtype=torch.float32, device=dev)
        logp_ref_NT = torch.zeros_like(logp_train_NT) if self.loss.kl_coef > 0 else None
        per_mb: list[dict[str, float]] = []
        skipped, first_mb_ratio_max, entropy_stats, gap_stats = 0, float("nan"), {}, {}
        self.model.train()
        for k, rows in enumerate(self.minibatch_rows(N, seed)):
            idx = torch.tensor(rows, device=dev)
            values_3MT = self._minibatch(
                batch,
                rows,
                idx,
                mask_NT,
                logp_rollout_NT,
                advantages_N,
                with_entropy=k == 0,
                correction=correction,
            )
            rt.sum_(values_3MT)  # every rank's tokens into the whole minibatch, on every rank
            logp_MT, ref_MT, ent_MT = values_3MT.unbind(0)
            logp_train_NT[idx] = logp_MT
            if logp_ref_NT is not None:
                logp_ref_NT[idx] = ref_MT
            if k == 0:
                entropy_stats = entropy_summary(ent_MT, mask_NT[idx])
                gap_MT = ((logp_MT.double() - logp_rollout_NT[idx]).exp() - 1).abs()
                first_mb_ratio_max = float(torch.where(mask_NT[idx], gap_MT, torch.zeros_like(gap_MT)).max())
                gap_stats = engine_gap(
                    logp_MT, logp_rollout_NT[idx], mask_NT[idx], eps_high=self.loss.eps_high
                )
            with torch.no_grad():  # the minibatch's metrics over all of its tokens, as one process has them
                out = objective(
                    self.loss,
                    logp_MT,
                    logp_rollout_NT[idx].to(logp_MT.dtype),
                    advantages_N[idx],
                    mask_NT[idx],
                    make_normalization(
                        self.loss,
                        len(rows),
                        self.max_new_tokens,
                        tokens=loss_tokens(mask_NT[idx], correction, idx),
                    ),
                    None if logp_ref_NT is None else ref_MT,
                    None if correction is None else correction.rows(idx),
                )
            metrics = dict(out.metrics)
            if not out.finite:
                self.optimizer.zero_grad()
                skipped += 1
                per_mb.append(metrics)
                continue
            if rt.distributed:
                self.optimizer.reduce_grads(rt.groups)
            report = self.optimizer.step()
            skipped += report.skipped
            metrics.update({"grad/norm": report.grad_norm, "optim/lr": report.lr})
            per_mb.append(metrics)
        out = _mean_metrics(per_mb)
        out.update(ratio_tail(logp_train_NT, logp_rollout_NT, mask_NT, eps_high=self.loss.eps_high))
        out.update(mismatch_metrics(logp_train_NT, logp_rollout_NT, mask_NT))
        out.update(gap_stats)
        out.update(entropy_stats)
        if logp_ref_NT is not None:
            out.update(kl_summary(logp_train_NT, logp_ref_NT, mask_NT))
        out["ratio/first_minibatch_max"] = first_mb_ratio_max
        out["loss/skipped"] = float(skipped)
        return out

    def _minibatch(
        self,
        batch,
        rows,
        idx,
        mask_NT,
        logp_rollout_NT,
        advantages_N,
        with_entropy,
        correction: BatchCorrection | None = None,
    ) -> torch.Tensor:
        """Forward and backward of this rank's share of one minibatch, micro-batch by micro-batch.

        With ``correction``, each sequence's ``sample_mean`` length counts only its kept tokens.
        Returns ``[3, M, T]``: this rank's log-probs, reference log-probs and entropy (zeros elsewhere),
        dropped tokens included (the ratio tail is taken over every token)."""
        M, T = len(rows), mask_NT.shape[1]
        out_3MT = torch.zeros((3, M, T), dtype=torch.float32, device=self.device)
        mine = list(range(M))[self.runtime.dp_slice(M)]
        lengths_M = (mask_NT[idx] if correction is None else correction.keep_NT[idx]).sum(dim=1)
        self.optimizer.zero_grad()
        locals_ = [mine[start : start + self.micro_batch] for start in range(0, len(mine), self.micro_batch)]
        ats = [torch.tensor(local, device=self.device) for local in locals_]
        groups = [[rows[i] for i in local] for local in locals_]
        refs: list = [None] * len(groups)
        if self.reference is not None:
            with torch.no_grad():
                refs = [
                    None if r is None else r[0] for r in self.score_many(self.reference, batch, groups, T)
                ]

        def loss_of(i: int, scores):
            logp_mT, owned_mT, ent_mT = scores
            at = ats[i]
            mask_mT = mask_NT[idx[at]] & owned_mT
            norm = self._normalization(M, lengths_M, at)
            loss = objective(
                self.loss,
                logp_mT,
                logp_rollout_NT[idx[at]].to(logp_mT.dtype),
                advantages_N[idx[at]],
                mask_mT,
                norm,
                refs[i],
                None if correction is None else correction.rows(idx[at]),
            )
            # A non-finite loss skips the step on every rank (the whole minibatch's loss is not finite
            # either), but every CP rank (and pipeline stage) must still run the backward its peers'
            # collectives wait in.
            return (loss.loss if loss.finite else 0.0 * logp_mT.sum()), (logp_mT.detach(), ent_mT, mask_mT)

        records = self.score_many(self.model, batch, groups, T, with_entropy, then=loss_of)
        for i, record in enumerate(records):
            if record is None:  # a pipeline stage other than the last: the caller's sum brings the values
                continue
            logp_mT, ent_mT, mask_mT = record
            at, keep = ats[i], mask_mT.to(torch.float32)
            out_3MT[0, at] = logp_mT.float() * keep
            if refs[i] is not None:
                out_3MT[1, at] = refs[i].float() * keep
            if ent_mT is not None:
                out_3MT[2, at] = ent_mT.float() * keep
        return out_3MT

    def _normalization(self, M: int, lengths_M: torch.Tensor, at: torch.Tensor) -> Normalization:
        """The whole minibatch's denominator (``lengths_M``: each row's loss tokens), for the shard ``at``."""
        whole = make_normalization(self.loss, M, self.max_new_tokens, tokens=int(lengths_M.sum()))
        if whole.kind == "token_sum":
            return whole
        return Normalization("sample_mean", lengths_N=lengths_M[at], num_sequences=M)


def loss_tokens(mask_MT: torch.Tensor, correction: BatchCorrection | None, idx) -> int:
    """The minibatch's tokens that enter the loss: its response tokens less those a correction dropped."""
    if correction is not None:
        mask_MT = mask_MT.bool() & correction.keep_NT[idx]
    return int(mask_MT.sum())


def engine_gap(
    logp_MT: torch.Tensor, logp_rollout_MT: torch.Tensor, mask_MT: torch.Tensor, *, eps_high: float
) -> dict[str, float]:
    """The first minibatch's tail and mismatch, under ``gap/``: scored before any update of the step, so the
    ratio there is the engines' difference alone (``gap/ratio/*``, ``gap/logratio/*``, ``gap/drift/*``,
    ``gap/mismatch/*``); the whole-batch ``ratio/*`` and ``mismatch/*`` add the later minibatches'
    staleness."""
    tail = ratio_tail(logp_MT, logp_rollout_MT, mask_MT, eps_high=eps_high)
    return {
        **{f"gap/{k}": v for k, v in tail.items()},
        **mismatch_metrics(logp_MT, logp_rollout_MT, mask_MT, prefix="gap/mismatch"),
    }


def replay_experts(model, experts: list, shard) -> dict[int, torch.Tensor]:
    """Per MoE layer ``[m, S, K]``: each row's reported experts at this shard's input columns (a fed token's
    experts sit at its own index; columns past a row's end and layout padding take expert 0, which only
    padding tokens see)."""
    device = shard.inputs_BS.device
    cols = torch.tensor([min(c, shard.width) for c in shard.columns], dtype=torch.long, device=device)
    out = {}
    for layer, _ in moe_layers(model):
        rows = []
        for e in experts:
            per = torch.as_tensor(e)[:, layer].to(device=device, dtype=torch.long)  # [P + O - 1, K]
            grid = per.new_zeros((shard.width + 1, per.shape[1]))
            grid[: per.shape[0]] = per.clamp(min=0)
            rows.append(grid.index_select(0, cols))
        out[layer] = torch.stack(rows)
    return out


def _mean_metrics(records: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the minibatches that reported it (non-finite values left out)."""
    keys = {k for r in records for k in r}
    out = {}
    for key in keys:
        values = np.asarray([r[key] for r in records if key in r], dtype=np.float64)
        values = values[np.isfinite(values)]
        out[key] = float(values.mean()) if values.size else float("nan")
    return out
