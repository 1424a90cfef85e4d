"""When an RL stage stops before its ``steps``: checked after every step, once ``min_steps`` are done.

- ``stop_when``: any threshold that holds on the step's metrics (``len/mean > 400``, ``ratio/p99 > 2``);
  a metric the step did not report never stops the stage;
- ``reward_plateau_steps``: the reward, smoothed over the last ``PLATEAU_WINDOW`` steps, has not beaten
  its best by ``PLATEAU_MIN_DELTA`` for that many steps (a single step's reward is too noisy to compare);
- ``max_wall_minutes``: time spent in the stage, summed over resumed attempts.

The tracking survives a resume through ``state()`` (stored in the resume point's meta).
"""

from __future__ import annotations

import math
from collections import deque

PLATEAU_WINDOW = 5
PLATEAU_MIN_DELTA = 0.01
REWARD_KEY = "reward/mean"


class StopConditions:
    def __init__(self, stage, state: dict | None = None):
        self.stage = stage
        state = state or {}
        self.recent = deque(state.get("recent", []), maxlen=PLATEAU_WINDOW)
        self.best = state.get("best")
        self.best_step = int(state.get("best_step", 0))

    def state(self) -> dict:
        return {"recent": list(self.recent), "best": self.best, "best_step": self.best_step}

    def _track_reward(self, steps_done: int, metrics: dict) -> None:
        reward = metrics.get(REWARD_KEY)
        if reward is None or not math.isfinite(float(reward)):
            return
        self.recent.append(float(reward))
        smoothed = sum(self.recent) / len(self.recent)
        if self.best is None or smoothed > self.best + PLATEAU_MIN_DELTA:
            self.best, self.best_step = smoothed, steps_done

    def check(self, steps_done: int, metrics: dict, wall_minutes: float) -> str | None:
        """The reason to stop after ``steps_done`` steps, or None to go on."""
        self._track_reward(steps_done, metrics)
        if steps_done < self.stage.min_steps:
            return None
        for threshold in self.stage.stop_when:
            if threshold.metric in metrics:
                holds, text = threshold.check(metrics)
                if holds:
                    return f"stop_when: {text}"
        plateau = self.stage.reward_plateau_steps
        if plateau and self.best is not None and steps_done - self.best_step >= plateau:
            return (
                f"reward_plateau: smoothed {REWARD_KEY} has not improved on {self.best:.4g} "
                f"(step {self.best_step}) in {steps_done - self.best_step} steps"
            )
        limit = self.stage.max_wall_minutes
        if limit is not None and wall_minutes >= limit:
            return f"max_wall_minutes: {wall_minutes:.1f} >= {limit:g}"
        return None
