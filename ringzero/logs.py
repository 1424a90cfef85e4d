"""Logging setup, called once from ``main()`` (never at import time).

Console: human-readable structlog lines on stderr. Run folder: the same events as JSON lines in
``<run_dir>/log.jsonl`` once ``attach_run_log`` is called by a runner that knows its folder.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def setup_logging(level: str = "info", run_dir: str | Path | None = None) -> None:
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
                structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
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
                structlog.processors.dict_tracebacks,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    root.addHandler(handler)
    return path
