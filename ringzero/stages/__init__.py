"""Stage runners: pretrain, RL (stage 1, stage 2, tiers), self-distillation, eval."""
