"""A user dataset: JSONL lines with a question and an answer (GSM8K-style ``... #### 42`` answers work).

Files are read and validated once; every malformed line is reported with its file and line number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ringzero.errors import RingzeroError
from ringzero.tasks.answers import answers_match, extract_answer, normalize_answer
from ringzero.tasks.base import PROMPT_TEMPLATE, Problem, RngLike, Split, Task, as_random
from ringzero.tasks.config import JsonlTask

MAX_REPORTED_LINES = 20
"""A file with more bad lines than this reports the first ones and the total."""


def _text_field(record: dict, name: str) -> str:
    if name not in record:
        raise ValueError(f"missing field {name!r}")
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {name!r} must be a string or a number (got {type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses to inf
        raise ValueError(f"field {name!r} must be a finite number (got {value})")
    text = str(value).strip()
    if not text:
        raise ValueError(f"field {name!r} is empty")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone "\ud800" escape decodes to no valid character
        raise ValueError(
            f"field {name!r} holds {text[exc.start]!r} at character {exc.start}, an unpaired "
            "surrogate that is not valid Unicode"
        ) from None
    return text


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON (JSON numbers are finite)")


def _record(raw: bytes, lineno: int) -> dict:
    """One line as a JSON object; every problem a ValueError saying what is wrong."""
    try:
        line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # a BOM may open the file
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None
    try:
        record = json.loads(line, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nests too deeply to be a record") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's own guard against huge int literals
            raise ValueError("holds an integer of more than 4300 digits") from None
        raise
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object (got {type(record).__name__})")
    return record


def _lines(path: Path):
    """``(line number, bytes)`` of the non-blank lines; JSONL ends each record with a newline alone."""
    try:
        with path.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if raw.strip():
                    yield lineno, raw
    except OSError as exc:
        raise RingzeroError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def load_problems(path: Path, question_field: str, answer_field: str, split: Split) -> list[Problem]:
    if path.is_dir():
        raise RingzeroError(f"{path}: a folder, not a JSONL file")
    if not path.is_file():
        raise RingzeroError(f"{path}: no such file")
    problems, bad = [], []
    for lineno, raw in _lines(path):
        try:
            record = _record(raw, lineno)
            question = _text_field(record, question_field)
            raw_answer = _text_field(record, answer_field)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            bad.append(f"{path}:{lineno}: {exc}")
            continue
        answer = extract_answer(raw_answer) or raw_answer
        problems.append(
            Problem(
                id=f"{split}:{lineno}",
                prompt=PROMPT_TEMPLATE.format(question=question),
                answer=normalize_answer(answer),
                meta={"source": str(path), "line": lineno},
            )
        )
    if bad:
        more = f"\n  ... and {len(bad) - MAX_REPORTED_LINES} more" if len(bad) > MAX_REPORTED_LINES else ""
        raise RingzeroError(
            f"{path}: {len(bad)} malformed line(s)\n  " + "\n  ".join(bad[:MAX_REPORTED_LINES]) + more
        )
    if not problems:
        raise RingzeroError(f"{path}: no problems (the file is empty)")
    return problems


class JsonlDataset(Task):
    stop = ("\nq:",)
    """Free-form answers may span lines; a response ends where the model starts the next question."""

    def __init__(self, cfg: JsonlTask, base_dir: str | Path | None = None):
        self.cfg = cfg
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        self._paths = {
            "train": base / cfg.train_path,
            "eval": base / cfg.eval_path if cfg.eval_path else None,
        }
        self._cache: dict[str, list[Problem]] = {}

    def problems(self, split: Split) -> list[Problem]:
        if split not in self._paths:
            raise ValueError(f"split must be 'train' or 'eval' (got {split!r})")
        if split not in self._cache:
            path = self._paths[split]
            if path is None:
                raise RingzeroError("task.eval_path: not set, so there is no eval split")
            self._cache[split] = load_problems(path, self.cfg.question_field, self.cfg.answer_field, split)
        return self._cache[split]

    def prompts(self, split: Split, n: int, rng: RngLike | None = None) -> list[Problem]:
        """Without replacement while the file lasts, then cycling; ``rng=None`` keeps the file's order."""
        pool = self.problems(split)
        order = list(range(len(pool)))
        if rng is not None:
            as_random(rng).shuffle(order)
        return [pool[order[i % len(order)]] for i in range(n)]

    def reward(self, problem: Problem, response: str) -> float:
        return 1.0 if answers_match(extract_answer(response), problem.answer) else 0.0
