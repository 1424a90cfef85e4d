"""Stop conditions of an RL stage: thresholds after min_steps, reward plateau, wall time, resumable state."""

from ringzero.config.stages import RLStage
from ringzero.stages.stop_conditions import PLATEAU_WINDOW, StopConditions


def stage(**kw):
    return RLStage(name="s", **kw)


def test_threshold_stops_only_after_min_steps_and_names_the_metric():
    stop = StopConditions(stage(min_steps=3, stop_when=["len/mean > 400", "ratio/p99 > 2"]))
    long = {"len/mean": 450.0, "ratio/p99": 0.1, "reward/mean": 0.5}
    assert stop.check(1, long, 0.0) is None and stop.check(2, long, 0.0) is None
    reason = stop.check(3, long, 0.0)
    assert reason.startswith("stop_when: len/mean = 450 satisfies len/mean > 400")
    assert stop.check(4, {"len/mean": 10.0, "ratio/p99": 3.0}, 0.0).startswith("stop_when: ratio/p99 = 3")


def test_a_missing_or_nan_metric_never_stops_the_stage():
    stop = StopConditions(stage(min_steps=0, stop_when=["ratio/p99 > 2"]))
    assert stop.check(5, {"len/mean": 3.0}, 0.0) is None
    assert stop.check(6, {"ratio/p99": float("nan")}, 0.0) is None


def test_reward_plateau_counts_steps_since_the_smoothed_best():
    stop = StopConditions(stage(min_steps=0, reward_plateau_steps=4))
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6] + [0.1] * 10
    reasons = [stop.check(i + 1, {"reward/mean": r}, 0.0) for i, r in enumerate(rewards)]
    first = next(i for i, r in enumerate(reasons) if r is not None)
    # Smoothed over PLATEAU_WINDOW steps the best is reached at step 6; the low tail never beats it,
    # so four steps later the stage stops.
    assert PLATEAU_WINDOW == 5 and first + 1 == 10
    assert reasons[first].startswith("reward_plateau: smoothed reward/mean has not improved")


def test_noisy_but_rising_reward_is_no_plateau():
    stop = StopConditions(stage(min_steps=0, reward_plateau_steps=4))
    rewards = [0.1 + 0.02 * i + (0.1 if i % 2 else -0.1) for i in range(30)]
    assert all(stop.check(i + 1, {"reward/mean": r}, 0.0) is None for i, r in enumerate(rewards))


def test_wall_time_limit():
    stop = StopConditions(stage(min_steps=0, max_wall_minutes=2))
    assert stop.check(1, {}, 1.9) is None
    assert stop.check(2, {}, 2.0) == "max_wall_minutes: 2.0 >= 2"


def test_state_survives_a_resume():
    settings = stage(min_steps=0, reward_plateau_steps=3)
    a = StopConditions(settings)
    for i, r in enumerate([0.5, 0.6, 0.2]):
        a.check(i + 1, {"reward/mean": r}, 0.0)
    b = StopConditions(settings, a.state())
    for i, r in enumerate([0.1, 0.1, 0.1]):
        assert a.check(i + 4, {"reward/mean": r}, 0.0) == b.check(i + 4, {"reward/mean": r}, 0.0)
    assert a.state() == b.state()
