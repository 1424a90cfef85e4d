"""Staged runs: stage identity, gates, the run manifest, and the local runner."""
