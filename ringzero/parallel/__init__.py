"""Context and data parallelism, applied to single-device model code from outside."""
