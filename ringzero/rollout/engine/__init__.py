"""The embedded rollout engine: batched decoding with caches (``embedded``), continuous batching, sampling,
stop rules, log-prob extras, routed-expert tracking, the bitwise mode, and ``gap``, the train/rollout
ratio-tail measurement that samples with it (``ringzero check gap``). Teacher-forced scoring and the
per-policy weight copies it shares with the trainer are ``ringzero.model.scoring`` / ``model.weights``."""
