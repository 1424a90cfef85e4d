"""One place that builds the rollout client of every sampling stage from ``engines.rollout``.

- ``embedded`` (or ``local=True``, for stages whose jobs get no rollout servers: see
  ``ringzero.cluster.step.SAMPLING_KINDS``): an ``EmbeddedEngine`` on ``model``, spread over the job's
  ranks when a runtime is given.
- ``sglang``: a ``ReplicaSet`` over every replica (``DistributedReplicaSet`` for ``weight_sync:
  distributed``), spread over the ranks the same way. One per server set and process: a stage that builds
  several (eval measures checkpoint after checkpoint) reuses its connections, the weight group it opened
  and the version it pushed last.

``serves``: the committed checkpoint ``model`` holds. The servers started with ``engines.rollout.served_uri``;
when ``serves`` is another checkpoint, its weights are pushed first (``distributed``: the tensors;
``disk``: a folder under ``weights_dir``; ``store``: the URI; one ``WeightPusher``) under the URI as version,
so samples come from the model the stage measures. Left unset, nothing is pushed: the caller pushes itself
(the RL loop does, before its first step, through its own ``WeightPusher``).
"""

from __future__ import annotations

from ringzero.model.precision import body_dtype
from ringzero.rollout.clients.http_client import HttpRolloutClient
from ringzero.rollout.clients.spread import spread
from ringzero.rollout.deployment.weight_push import WeightPusher
from ringzero.rollout.replicas.distributed_set import DistributedReplicaSet
from ringzero.rollout.replicas.endpoints import resolve_endpoints
from ringzero.rollout.replicas.replica_set import ReplicaSet

_REMOTE: dict[str, ReplicaSet] = {}
_SERVING: dict[int, str | None] = {}  # id(replica set) -> checkpoint its servers hold, when known


def rollout_client(
    cfg,
    model,
    tokenizer,
    runtime=None,
    *,
    seed: int,
    max_batch: int,
    deterministic: bool = False,
    serves: str | None = None,
    local: bool = False,
):
    """The rollout client a stage samples with; ``runtime`` spreads it over the job's ranks (None: as is)."""
    engine = cfg.engines.rollout
    if engine.kind == "embedded" or local:
        from ringzero.rollout.engine.embedded import EmbeddedEngine

        client = EmbeddedEngine(
            model,
            tokenizer,
            cfg.precision.rollout,
            deterministic=deterministic,
            max_batch=max_batch,
            seed=seed,
        )
        return client if runtime is None else spread(client, runtime)
    shape = (cfg.model.num_hidden_layers, cfg.model.num_experts_per_tok) if cfg.model.num_experts else None
    remote = remote_client(engine, cfg.precision.rollout, shape)
    client = remote if runtime is None else spread(remote, runtime)
    if serves is not None:
        _serve(client, remote, engine, model, serves, runtime, tokenizer, cfg.precision.rollout)
    return client


def remote_client(engine, policy=None, routing_shape=None) -> ReplicaSet:
    """The ``ReplicaSet`` of ``engines.rollout`` (kind sglang), built once per process; ``policy`` is the
    rollout precision policy (distributed pushes are cast to its body dtype)."""
    key = engine.model_dump_json()
    if key not in _REMOTE:
        endpoints = resolve_endpoints(engine)
        # Found again after a loss: whatever resolves now (a replaced pod may not be ready yet).
        common = dict(
            connect=HttpRolloutClient,
            stale=engine.stale,
            weights_dir=engine.weights_dir,
            timeout_s=engine.timeout_s,
            accept_store_uris=engine.weight_sync == "store",
            resolver=lambda: resolve_endpoints(engine, want=1, timeout_s=0.0),
            # with every replica down, wait for one to come back (a restarted SGLang pod loads the
            # model again) as long as a request may take
            rejoin_wait_s=engine.timeout_s,
        )
        if engine.weight_sync == "distributed":
            d = engine.distributed
            remote = DistributedReplicaSet(
                endpoints,
                tp_size=engine.tp_size,
                backend=d.backend,
                master_address=d.master_address,
                master_port=d.master_port,
                group_name=d.group_name,
                sync_timeout_s=d.timeout_s,
                dtype=None if policy is None else body_dtype(policy),
                **common,
            )
        else:
            remote = ReplicaSet(endpoints, **common)
        for c in remote.clients:  # decodes meta_info["routed_experts"] (routing replay)
            c.routing_shape = routing_shape
        _REMOTE[key] = remote
        _SERVING[id(remote)] = engine.served_uri
    return _REMOTE[key]


def close_remote_clients() -> None:
    """Forget every cached replica set (tests; a process that points at new servers)."""
    for remote in _REMOTE.values():
        remote.close()
    _REMOTE.clear()
    _SERVING.clear()


def _serve(client, remote: ReplicaSet, engine, model, uri: str, runtime, tokenizer, policy) -> None:
    if _SERVING.get(id(remote)) == uri and remote.weight_version in (None, uri):
        return
    pusher = WeightPusher.for_rollout(
        engine, model_cfg=getattr(model, "cfg", None), runtime=runtime, tokenizer=tokenizer
    )
    # a store push names the committed checkpoint itself: no tensors leave the model
    state = {} if pusher.mode == "store" else model.state_dict()
    pusher.push(client, state, uri, dtype=body_dtype(policy), committed_uri=uri)
    _SERVING[id(remote)] = uri
