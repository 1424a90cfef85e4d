"""Suite-wide settings. Each area keeps its fixtures in its own folder's conftest.py."""

import os
import re

import pytest
from ci_require import CI_PROVIDED, MISSING, on_ci
from hypothesis import settings

# Two cores are shared by two pytest workers: one intra-op thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

# Hypothesis: no per-example deadline anywhere (two shared cores make any wall-clock limit a flake, and no
# test here asserts speed). On CI (ci_require.on_ci: CI=true, 1 or yes) Hypothesis's own ci profile:
# derandomized, so a failure reproduces from the log, no example database, the too-slow check off.
# HYPOTHESIS_PROFILE=dev|ci picks one by hand.
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if on_ci() else "dev"))

_IMPORTORSKIP = re.compile(r"could not import '([\w.]+)'")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def _ci_should_have(reason: str) -> bool:
    """A skip for something CI provides: ``ci_require``'s marked reasons, or an importorskip of its
    packages."""
    if MISSING in reason:
        return True
    found = _IMPORTORSKIP.search(reason)
    return bool(found) and found.group(1).split(".")[0] in CI_PROVIDED


def _fail_under_ci(report) -> None:
    if on_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if _ci_should_have(reason):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, where it must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_under_ci(outcome.get_result())
