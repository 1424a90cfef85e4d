"""SIGTERM handling of the step loops (``ringzero.stages.preemption``): inside a loop the notice waits for
the next step boundary, outside one it exits at once, and the watchdog ends a process that never gets
there within the grace period."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ringzero.stages import preemption


@pytest.fixture(autouse=True)
def fresh():
    preemption.reset()
    yield
    preemption.reset()


def test_inside_a_step_loop_the_notice_waits_for_the_step_boundary():
    with preemption.installed(60.0), preemption.preemptible():
        assert not preemption.due(None)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs between bytecodes of this thread
        assert preemption.requested() and preemption.due(None)


def test_outside_a_step_loop_sigterm_exits_at_once():
    with preemption.installed(60.0), pytest.raises(SystemExit) as exc:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
    assert exc.value.code == 143


def test_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.installed(60.0):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_watchdog_ends_a_loop_that_never_reaches_its_boundary():
    script = (
        "import os, signal, time\nfrom ringzero.stages import preemption\n"
        "preemption.install(0.5)\n"
        "with preemption.preemptible():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)\n"
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 143, done.stderr.decode()
    assert took < 20, f"the watchdog did not end the process within its grace period ({took:.1f} s)"


def test_a_grace_period_must_be_positive():
    with pytest.raises(ValueError, match="must be positive"):
        preemption.install(0)


def test_reset_stops_the_watchdog():
    """A notice taken in a test must not end the test process later (the watchdog is cancelled)."""
    with preemption.installed(0.3), preemption.preemptible():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert preemption.requested()
        preemption.reset()
    time.sleep(0.6)  # past the grace period: still alive
    assert not preemption.requested()
