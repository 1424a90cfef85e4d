"""One file per loss; each takes tensors and returns ``LossOutput(loss, metrics)``.

- ``sg_clip_is_loss``: the seed's stop-gradient clipped IS loss (every token keeps a gradient).
- ``ppo_clip_loss``: PPO's clipped surrogate, the reference.
- ``kl_k3_loss``: k3 KL to the frozen reference.
- ``Normalization``: ``token_sum`` (stage 1) or ``sample_mean`` (stage 2 on).

The stage's objective, these assembled from its ``LossSettings`` with the mismatch corrections, is
``ringzero.rl.objective`` (a floor up: it reads the corrections, which read these losses).
"""

from ringzero.rl.losses.base import LossOutput
from ringzero.rl.losses.kl import kl_k3_loss
from ringzero.rl.losses.normalization import Normalization
from ringzero.rl.losses.ppo_clip import ppo_clip_loss
from ringzero.rl.losses.sg_clip_is import sg_clip_is_loss

__all__ = [
    "LossOutput",
    "Normalization",
    "kl_k3_loss",
    "ppo_clip_loss",
    "sg_clip_is_loss",
]
