"""RL tests import ``ringzero.stages.config`` directly; that module needs ``ringzero.config`` loaded first
(the run config imports the stage configs), so load it here once."""

import ringzero.config  # noqa: F401
