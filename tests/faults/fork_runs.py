"""``ringzero`` runs forked from a warm interpreter: the fault campaign's runs without their startup.

A run of the CLI spends about 1.5 s importing torch and the package before its stage starts, and a fault
trial makes two or three runs. ``ForkServer`` starts one helper process that imports all of it once and
then forks a child per run. Each child is a real, separate process: it becomes the leader of its own
session (so a whole run can be killed with ``os.killpg``), takes the environment it was given (fault
points included: ``sitecustomize`` installs them again in the child), runs ``ringzero.cli.main`` with the
given arguments, and exits the way the interpreter would: ``atexit`` handlers run, then the exit status.
A SIGKILL kills it like any other process; a run with ``--nproc`` goes on to start its ranks through
torchrun as usual.

The helper imports torch without running anything on a thread pool (``OMP_NUM_THREADS=1``), so that a
fork copies no half-held lock of an OpenMP or BLAS pool. ``ForkedRun`` has the part of
``subprocess.Popen`` the campaign uses: ``pid``, ``args``, ``poll``, ``wait``, ``communicate`` (the run's
combined stdout and stderr), ``returncode`` (``-N`` for a death by signal ``N``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HELPER = r"""
import atexit, json, os, signal, sys, threading, traceback
import torch  # noqa: F401  - the point of the helper: imported once, before any fork
import ringzero.cli.main as cli
import ringzero.cli.run_cmd, ringzero.pipeline.local  # noqa: F401
import ringzero.stages.pretrain, ringzero.stages.rl  # noqa: F401
import ringzero.stages.distill, ringzero.stages.evaluate, ringzero.store.s3  # noqa: F401
out_lock = threading.Lock()

def say(message):
    with out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

def reap():
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            if done.wait(0.05):
                return
            continue
        say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

def child(request):
    os.setsid()
    out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    paths = request["env"].get("PYTHONPATH", "").split(os.pathsep)
    sys.path[:0] = [p for p in paths if p and p not in sys.path]
    # what `python -m ringzero.cli.main ...` would see (torchrun reads it)
    sys.argv = [cli.__file__, *request["argv"]]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        if os.environ.get("RINGZERO_FAULT") or os.environ.get("RINGZERO_FAULT_COUNT"):
            import sitecustomize
            sitecustomize._install()
        code = cli.main(request["argv"]) or 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

done = threading.Event()
reaper = None
say({"ready": os.getpid()})
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(request)
    say({"started": pid, "id": request["id"]})
    if reaper is None:
        reaper = threading.Thread(target=reap, daemon=True)
        reaper.start()
done.set()
"""


class ForkServer:
    """One warm helper per process that uses it; ``start`` forks a run from it."""

    def __init__(self, root: Path, env: dict):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", HELPER],
            cwd=root,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()
        self._started: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        self._next = 0
        self._folder = Path(tempfile.mkdtemp(prefix="ringzero-forks-"))
        threading.Thread(target=self._read, daemon=True).start()
        with self._changed:  # the imports done: a run's timing starts at its fork, not at the helper's start
            self._changed.wait_for(lambda: self._ready or self._closed, 300)
        if not self._ready:
            raise RuntimeError("the fork server did not start (see its stderr above)")

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:  # something the helper's imports printed: not ours
                continue
            with self._changed:
                if "ready" in message:
                    self._ready = True
                elif "started" in message:
                    self._started[message["id"]] = message["started"]
                else:
                    self._exits[message["exited"]] = message["code"]
                self._changed.notify_all()
        with self._changed:  # the helper is gone: nothing more will start or exit
            self._closed = True
            self._changed.notify_all()

    _closed = False
    _ready = False

    def start(self, argv: list[str], env: dict, cwd: Path) -> ForkedRun:
        with self._lock:
            self._next += 1
            request = {
                "id": self._next,
                "argv": argv,
                "env": env,
                "cwd": str(cwd),
                "out": str(self._folder / f"run-{self._next}.log"),
            }
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        with self._changed:
            self._changed.wait_for(lambda: request["id"] in self._started or self._closed)
            if self._closed:
                raise RuntimeError("the fork server exited")
            pid = self._started.pop(request["id"])
        return ForkedRun(self, pid, ["ringzero", *argv], Path(request["out"]))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._closed, timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(30)


class ForkedRun:
    """The ``subprocess.Popen`` surface of one forked run."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], out: Path):
        self._server, self.pid, self.args, self._out = server, pid, args, out
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        self.wait(timeout)
        text = self._out.read_text(errors="replace") if self._out.exists() else ""
        self._out.unlink(missing_ok=True)
        return text, None


_SERVERS: dict[int, ForkServer] = {}


def fork_server(root: Path, env: dict) -> ForkServer:
    """This process's helper (started on first use)."""
    if os.getpid() not in _SERVERS:
        _SERVERS[os.getpid()] = ForkServer(root, env)
    return _SERVERS[os.getpid()]
