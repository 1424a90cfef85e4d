"""Rollout engines and clients: the embedded engine, an SGLang-compatible HTTP server, and one client
interface."""
