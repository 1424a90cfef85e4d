"""Seeds derived from the run seed and a path of names (``derive_seed(seed, "rl-prompts", step)``).

Everything random in a step (its prompts, each prompt's sampling stream, the minibatch shuffle) is a
pure function of (run seed, step), so a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, *parts) -> int:
    """A 63-bit seed, stable across processes and Python versions (no ``hash()``)."""
    text = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1
