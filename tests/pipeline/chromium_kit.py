"""Headless Chromium for the report test: load a page from disk, return its DOM and its console output.

The browser comes from tests/servers/chromium-start.sh (RINGZERO_CHROMIUM). ``--dump-dom`` prints the
DOM after the page's scripts ran; ``--enable-logging=stderr`` puts every console message and uncaught
exception on stderr as a ``CONSOLE`` line, which is how errors are found without a DevTools client.
"""

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
CONSOLE_LINE = re.compile(r":CONSOLE[:(][^\]]*\]\s*(.*)")
LAUNCH_GUARD_S = 120  # only a guard against a hung browser; no assertion depends on how long it takes


@dataclass
class Rendered:
    dom: str
    console: list[str]  # one entry per console message or uncaught exception


def browser() -> str:
    if os.environ.get("RINGZERO_CHROMIUM_ERROR"):
        pytest.fail(os.environ["RINGZERO_CHROMIUM_ERROR"])
    found = (
        os.environ.get("RINGZERO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not found:
        pytest.fail("chromium not found: run tests/servers/chromium-start.sh (tests/run_all.sh does) first")
    return found


def _run(page: Path, profile: Path, extra: list[str]) -> subprocess.CompletedProcess:
    cmd = [
        browser(),
        *FLAGS,
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *extra,
        page.resolve().as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=LAUNCH_GUARD_S, check=False)


def render(page: Path, profile: Path) -> Rendered:
    """The DOM after load and the console messages; ``profile`` must be a fresh folder."""
    proc = _run(page, profile, ["--dump-dom"])
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    console = [m.group(1) for m in map(CONSOLE_LINE.search, proc.stderr.splitlines()) if m]
    return Rendered(proc.stdout, console)


def screenshot(page: Path, profile: Path, out: Path, size: str = "1400,2400") -> Path:
    proc = _run(page, profile, [f"--screenshot={out}", f"--window-size={size}"])
    assert proc.returncode == 0 and out.exists(), f"chromium screenshot failed: {proc.stderr[-2000:]}"
    return out
