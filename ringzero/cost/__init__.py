"""What a run costs on a cluster: parameters, bytes per GPU, communication, step time and rollout bounds
(``ringzero cluster plan CONFIG --gpu KIND``). ``plan`` composes ``params``, ``memory``, ``training`` and
``rollout`` over the GPU table ``gpus``."""
