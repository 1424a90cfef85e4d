"""Sampling spread over every rank of a job: each rank generates its share, every rank gets all of it.

A request (one prompt with its ``n`` samples) is never split, so a GRPO group is sampled on one rank.
Rank r takes a contiguous share of the requests, runs it on its own client (its embedded engine on its
own device, or the SGLang servers it was pointed at) and the completions are gathered in request
order on every rank. With per-request seeds the tokens are those one process would sample (the
embedded engine's seeded streams do not depend on which requests share a batch), so the layout never
changes a rollout.

Weight pushes: an embedded engine per rank receives the rank's own (identical) weights on every rank.
A client whose servers every rank shares (``client.shared``, the SGLang ``ReplicaSet``) is pushed to once,
by rank 0; the other ranks record the pushed version (their completions are checked against it) and
wait for the push. ``update_weights`` is offered exactly when the wrapped client has it, so
``ringzero.rollout.deployment.weight_push`` pushes through the wrapper as without it.
``pop_metrics`` sums the ranks' counts (a collective: every rank calls it).
"""

from __future__ import annotations

from collections.abc import Sequence

from ringzero.parallel.runtime import Runtime
from ringzero.rollout.types import Completion, GenerateRequest


class SpreadClient:
    def __init__(self, client, runtime: Runtime):
        self.client, self.runtime = client, runtime

    def __getattr__(self, name: str):
        if name == "update_weights" and getattr(self.client, "shared", False):
            getattr(self.client, name)  # AttributeError when the client has no in-process transport
            return self._shared_update_weights
        return getattr(self.client, name)

    def generate(self, requests: Sequence[GenerateRequest]) -> list[list[Completion]]:
        if not self.runtime.distributed:
            return self.client.generate(requests)
        share = self.runtime.world_slice(len(requests))
        mine = self.client.generate(list(requests[share])) if share.stop > share.start else []
        out: list[list[Completion]] = []
        for part in self.runtime.all_gather(mine):
            out.extend(part)
        return out

    def update_weights_from_disk(self, uri: str, weight_version: str) -> None:
        self._once(lambda: self.client.update_weights_from_disk(uri, weight_version), weight_version)

    def _shared_update_weights(self, state_dict, weight_version: str) -> None:
        self._once(lambda: self.client.update_weights(state_dict, weight_version), weight_version)

    def _once(self, push, weight_version: str) -> None:
        if self.runtime.is_main:
            push()
        elif hasattr(self.client, "expect_version"):
            self.client.expect_version(weight_version)
        self.runtime.barrier()

    def pop_metrics(self) -> dict[str, float]:
        mine = self.client.pop_metrics() if hasattr(self.client, "pop_metrics") else {}
        if not self.runtime.distributed:
            return mine
        total: dict[str, float] = {}
        for part in self.runtime.all_gather(mine):
            for k, v in part.items():
                total[k] = total.get(k, 0.0) + v
        return total


def spread(client, runtime: Runtime):
    return client if not runtime.distributed else SpreadClient(client, runtime)
