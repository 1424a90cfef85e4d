"""A stage's rollout deployment: which engine it samples with and how the trainer's weights reach it.

- ``connect``: the one place a stage gets its rollout client from ``engines.rollout`` (the embedded engine,
  or a replica set of SGLang-compatible servers, each spoken to by ``clients.http_client``);
- ``weight_push``: ``WeightPusher``, the push transport chosen once from the same settings (in process,
  distributed tensors, a folder on a shared volume, or a store checkpoint);
- ``folder_push``: the shared-volume transport's folder writer.

This floor sits above ``clients/`` and ``replicas/``, which never import each other: a replica set is
handed the per-server client it spreads over (``connect=``).
"""
