"""Typed run configuration: ``load_config(path, overrides)`` returns a validated ``RunConfig``."""

from ringzero.config.loader import config_hash, load_config, parse_config
from ringzero.config.run import RunConfig

__all__ = ["RunConfig", "config_hash", "load_config", "parse_config"]
