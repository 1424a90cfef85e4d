"""A captured run speaks at a bounded interval, steps or not; a terminal gets the bar instead."""

import sys
import threading
import time

import pytest
import structlog
from structlog.testing import capture_logs

from ringzero.stages import progress
from ringzero.stages.progress import step_progress

BEAT_S = 0.05


@pytest.fixture
def records(monkeypatch):
    """The ``progress`` records of a non-terminal run with a short heartbeat."""
    monkeypatch.setattr(progress, "HEARTBEAT_S", BEAT_S)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    # A fresh logger: one cached by an earlier setup_logging() would bypass the capture.
    monkeypatch.setattr(progress, "log", structlog.get_logger(progress.__name__))
    with capture_logs() as logs:
        yield _ProgressView(logs)


class _ProgressView:
    def __init__(self, logs: list[dict]):
        self.logs = logs

    def __call__(self) -> list[dict]:
        return [r for r in list(self.logs) if r["event"] == "progress"]

    def wait_for(self, match, timeout_s: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found := [r for r in self() if match(r)]:
                return found[-1]
            time.sleep(BEAT_S / 5)
        raise AssertionError(f"no matching progress record in {self()}")


def _beating() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("progress ")]


def test_a_phase_without_steps_speaks_while_it_waits(records):
    with step_progress("distill", phase="sample"):
        time.sleep(BEAT_S * 8)
        during = records()
    assert len(during) >= 3  # the heartbeat, not the block, wrote them
    assert all(r["stage"] == "distill" and r["phase"] == "sample" for r in during)
    assert all("step" not in r and "eta_s" not in r for r in during)  # no step counter to report
    assert [r["elapsed_s"] for r in during] == sorted(r["elapsed_s"] for r in during)


def test_a_step_loop_reports_its_metric_rate_and_eta(records, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress, "_now", lambda: clock[0])
    with step_progress("pretrain", 10, done=2) as advance:  # resumed at step 2
        for loss in (1.5, 1.4, 1.3):
            clock[0] += 2.0  # each step takes 2 s and processes 1000 tokens
            advance(loss, tokens=1000)
        beat = records.wait_for(lambda r: r.get("step") == 5)
    assert beat["stage"] == "pretrain" and beat["phase"] == "train"
    assert (beat["step"], beat["total"], beat["loss"], beat["elapsed_s"]) == (5, 10, 1.3, 6.0)
    assert beat["tokens_per_s"] == 500.0
    assert beat["eta_s"] == 10  # 5 steps left at this block's 2 s per step
    assert beat["log_level"] == "info"


def test_the_phase_can_change_under_one_counter(records):
    with step_progress("eval", 2, metric="accuracy") as advance:
        advance.phase = "stage1"
        records.wait_for(lambda r: r["phase"] == "stage1" and r["step"] == 0)
        advance(0.25)
        advance.phase = "input"
        beat = records.wait_for(lambda r: r["phase"] == "input")
    assert (beat["step"], beat["total"], beat["accuracy"]) == (1, 2, 0.25)
    assert "tokens_per_s" not in beat  # eval reports no tokens


def test_nothing_is_written_after_the_block(records):
    with step_progress("rl stage1", 4, metric="reward") as advance:
        advance(0.5, tokens=64)
        time.sleep(BEAT_S * 3)
    assert not _beating()
    written = records()
    assert written[-1]["step"] == 1 and written[-1]["reward"] == 0.5  # the block's last status, on exit
    time.sleep(BEAT_S * 4)
    assert records() == written


def test_an_exception_in_the_block_propagates_and_stops_the_heartbeat(records):
    with pytest.raises(RuntimeError, match="boom"), step_progress("distill", 3):
        time.sleep(BEAT_S * 2)
        raise RuntimeError("boom")
    assert not _beating()
    written = records()
    time.sleep(BEAT_S * 4)
    assert records() == written


def test_a_terminal_gets_the_bar_and_no_records(monkeypatch, capsys):
    monkeypatch.setattr(progress, "HEARTBEAT_S", BEAT_S)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setattr(progress, "log", structlog.get_logger(progress.__name__))
    with capture_logs() as logs, step_progress("pretrain", 3) as advance:
        assert not _beating()
        advance(2.5, tokens=100)
        advance.phase = "heldout"
        time.sleep(BEAT_S * 3)
    assert not [r for r in logs if r["event"] == "progress"]
    assert "pretrain" in capsys.readouterr().err
