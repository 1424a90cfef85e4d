"""Logging setup, called once from ``main()`` (never at import time).

Console: human-readable structlog lines on stderr. Run folder: the same events as JSON lines in
``<run_dir>/log.jsonl`` once ``attach_run_log`` is called by a runner that knows its folder.

Tracebacks show frames (file, line, function, source line), never local variables: a failing call whose
frame holds a credential, a presigned URL or a request body would otherwise write it to the console
(``kubectl logs``, the pipeline UI's log pane) and to ``log.jsonl``. structlog's renderers print locals
by default (``RichTracebackFormatter`` and ``ExceptionDictTransformer`` both have ``show_locals=True``);
here they do only under an explicit ``--log-level debug``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog
from structlog.tracebacks import ExceptionDictTransformer

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_state = {"show_locals": False}  # set by setup_logging: True only at --log-level debug


def _console_tracebacks(show_locals: bool):
    if structlog.dev.rich is None:  # without rich: Python's own traceback text, which has no locals
        return structlog.dev.plain_traceback
    return structlog.dev.RichTracebackFormatter(show_locals=show_locals)


def _json_tracebacks(show_locals: bool) -> structlog.processors.ExceptionRenderer:
    return structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=show_locals))


def setup_logging(level: str = "info", run_dir: str | Path | None = None) -> None:
    _state["show_locals"] = level == "debug"
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(
                    colors=sys.stderr.isatty(), exception_formatter=_console_tracebacks(_state["show_locals"])
                ),
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [console]
    root.setLevel(_LEVELS[level])
    for noisy in ("urllib3", "botocore", "werkzeug", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if run_dir is not None:
        attach_run_log(run_dir)


def quiet_for_rank(rank: int) -> None:
    """Ranks other than 0 of a job print warnings and errors only (their events still reach their log
    file), and every event names its rank."""
    structlog.contextvars.bind_contextvars(rank=rank)
    if rank:
        for handler in logging.getLogger().handlers:
            if not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.WARNING)


def attach_run_log(run_dir: str | Path, rank: int = 0) -> Path:
    """Also write every log event as a JSON line to ``<run_dir>/log.jsonl`` (``log.rank<N>.jsonl`` for
    rank N > 0 of a job, so ranks never interleave lines in one file)."""
    path = Path(run_dir) / ("log.jsonl" if not rank else f"log.rank{rank}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for h in root.handlers:
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path.resolve():
            return path
    handler = logging.FileHandler(path)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _json_tracebacks(_state["show_locals"]),
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root.addHandler(handler)
    return path
