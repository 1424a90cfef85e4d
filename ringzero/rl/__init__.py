"""The RL step's pure pieces: group advantages, one file per loss, and the metrics that expose the ratio tail.

Kept light: importing ``ringzero.rl`` imports nothing; ``ringzero.rl.losses`` and the metric modules
import torch when a stage asks for them.
"""
