"""Verifiable tasks: prompts with ground truth and pure, deterministic rewards."""
