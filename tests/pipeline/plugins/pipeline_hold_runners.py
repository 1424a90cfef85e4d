"""The real RL runner with a test-only pause, so a test can kill a run at a known point.

With ``RINGZERO_TEST_HOLD_AT=STAGE:STEP``, the RL stage named STAGE stops right after it committed the
resume point of STEP and waits to be killed; any other stage, or no variable, runs untouched. The
test then kills the whole run with SIGKILL instead of racing a timer against a training loop.
"""

from __future__ import annotations

import os
import time

from ringzero.stages import rl as real_rl
from ringzero.stages import train_state

HOLD_ENV = "RINGZERO_TEST_HOLD_AT"


def rl(ctx, stage, inputs):
    name, _, step = os.environ.get(HOLD_ENV, "").partition(":")
    if name == stage.name:
        commit = train_state.save_resume_point

        def commit_then_hold(store, prefix, at_step, *args, **kwargs):
            uri = commit(store, prefix, at_step, *args, **kwargs)
            while at_step == int(step):  # committed: wait here for the SIGKILL
                time.sleep(0.05)
            return uri

        train_state.save_resume_point = commit_then_hold  # every stage commits through train_state
        try:
            return real_rl.run(ctx, stage, inputs)
        finally:
            train_state.save_resume_point = commit
    return real_rl.run(ctx, stage, inputs)
