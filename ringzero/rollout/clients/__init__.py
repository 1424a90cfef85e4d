"""What stages use to sample: the HTTP client of SGLang's API, the sampling spread over a job's ranks, and the
factory that picks the client from ``engines.rollout``."""
