"""A user dataset: JSONL lines with a question and an answer (GSM8K-style ``... #### 42`` answers work).

Files are read and validated once; every malformed line is reported with its file and line number.
"""

from __future__ import annotations

import json
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
    text = str(value).strip()
    if not text:
        raise ValueError(f"field {name!r} is empty")
    return text


def load_problems(path: Path, question_field: str, answer_field: str, split: Split) -> list[Problem]:
    if not path.is_file():
        raise RingzeroError(f"{path}: no such file")
    problems, bad = [], []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"expected a JSON object (got {type(record).__name__})")
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
        self._paths = {"train": base / cfg.train_path, "eval": base / cfg.eval_path if cfg.eval_path else None}
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
