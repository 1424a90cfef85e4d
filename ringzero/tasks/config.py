"""Typed task settings; ``kind`` selects the task family."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from ringzero.strict_model import StrictModel

MAX_LABELLED_DIGITS = 26
"""digitsum and parity name each input digit with a letter a-z, so they take at most 26 digits."""


class TaskSettings(StrictModel):
    """What every task kind has."""

    eval_prompts: int = Field(128, ge=1, description="held-out prompts for evaluation")


class ArithmeticTask(TaskSettings):
    """Synthetic arithmetic with difficulty knobs, a worked-trace format and a web-like pretraining corpus.

    ``digitsum`` (sum of the digits mod 10) is the default because no shortcut reaches it: see
    ``ringzero.tasks.arithmetic`` for why the direct route stays out of reach and the trace does not.
    """

    kind: Literal["arithmetic"] = "arithmetic"
    operation: Literal["digitsum", "parity", "add"] = Field(
        "digitsum",
        description="digitsum: sum of the digits mod 10; parity: of bits; add: long addition with column "
        "steps",
    )
    digits: int = Field(
        12, ge=2, le=64, description="input digits (bits for parity; digits per operand for add)"
    )
    min_digits: int | None = Field(
        None,
        ge=2,
        description="mixed difficulty: each problem has between min_digits and digits labelled digits "
        "(uniform), the difficulty eval and tier RL report by; null = always digits. digitsum and parity "
        "only",
    )
    short_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of corpus traces in the short form, which adds two digits per "
        "step (half the steps, each one harder); digitsum and parity only",
    )
    operands: int = Field(2, ge=2, le=8, description="numbers to add; add only")
    trace_fraction: float = Field(
        0.05, ge=0.0, le=1.0, description="share of corpus answers written as worked traces (always correct)"
    )
    verbose_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="share of corpus traces in the verbose form (redundant arithmetic per step)",
    )
    verbosity: Literal["trace", "step"] = Field(
        "trace",
        description="trace: verbose_fraction picks the form once per corpus trace; step: once per step, "
        "so one trace mixes both forms and its length varies around its digit count; digitsum and parity "
        "only",
    )
    check_weights: list[float] | None = Field(
        None,
        description="shares of corpus traces followed by 0, 1, 2, ... check passes (a check works the sum "
        "again from the start and its answer is the trace's); null = no checks; digitsum and parity only",
    )
    check_order: Literal["forward", "reverse"] = Field(
        "forward",
        description="forward: a check pass reads the digits in the first pass's order; reverse: from "
        "the last to the first, so its running states differ from the first pass's and must be worked out, "
        "not "
        "copied (the same final sum); digitsum and parity only",
    )
    check_verbosity: Literal["drawn", "verbose"] = Field(
        "drawn",
        description="drawn: a check pass's steps are verbose or terse like a first pass's; verbose: every "
        "check step writes its arithmetic out (a check is the careful pass); digitsum and parity only",
    )
    terse_form: Literal["restated", "implicit"] = Field(
        "restated",
        description="restated: a terse step writes the digit it reads (`c=9>6`); implicit: only its "
        "label and the new state (`c>6`), so the lookup and the addition happen in one token; digitsum and "
        "parity only",
    )
    slip_rate: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="chance that a terse first-pass step from slip_from on writes a wrong "
        "state (the pass carries on from it, so only a check catches it); digitsum and parity only",
    )
    slip_from: int = Field(1, ge=1, description="the first step (1-based) of a first pass that can slip")
    direct_noise: float = Field(
        0.5, ge=0.0, le=1.0, description="share of direct answers in the corpus that are wrong"
    )
    filler_fraction: float = Field(
        0.2, ge=0.0, le=1.0, description="share of corpus documents that are filler text"
    )
    drill_fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="share of corpus documents that drill the one-step facts traces use"
    )
    lookup_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of corpus documents that list labelled digits and read them back by label "
        "(the lookup each trace step makes); digitsum and parity only",
    )
    worked_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="share of corpus documents that are textbook worked examples (`example:` ... "
        "`solution:`), "
        "outside the q/a format whose answers set the base's trace usage",
    )

    @model_validator(mode="after")
    def _knobs_fit_operation(self) -> ArithmeticTask:
        problems = []
        if self.operation != "add" and self.operands != 2:
            problems.append(f"operands: only 'add' takes several operands (got {self.operands})")
        if self.operation != "add" and self.digits > MAX_LABELLED_DIGITS:
            problems.append(
                f"digits: '{self.operation}' labels its digits a-z, so at most {MAX_LABELLED_DIGITS} (got "
                f"{self.digits})"
            )
        if self.operation == "add" and (self.min_digits is not None or self.short_fraction > 0):
            problems.append(
                "min_digits: 'add' has neither a mixed length nor a short trace form (leave min_digits "
                "null and short_fraction 0)"
            )
        if self.min_digits is not None and self.min_digits > self.digits:
            problems.append(f"min_digits: must be at most digits ({self.digits}), got {self.min_digits}")
        if self.operation == "add" and self.lookup_fraction > 0:
            problems.append("lookup_fraction: 'add' has no labelled digits to look up (set it to 0)")
        labelled = self.operation != "add"
        if not labelled and (
            self.verbosity != "trace"
            or self.check_weights is not None
            or self.slip_rate > 0
            or self.check_order != "forward"
            or self.check_verbosity != "drawn"
            or self.terse_form != "restated"
        ):
            problems.append(
                "verbosity: 'add' has no per-step verbosity, check passes or slips (leave verbosity "
                "'trace', check_weights null, check_order 'forward', check_verbosity 'drawn', terse_form "
                "'restated' and slip_rate 0)"
            )
        if self.check_weights is not None:
            w = self.check_weights
            if not w or any(x < 0 for x in w) or abs(sum(w) - 1.0) > 1e-6:
                problems.append(
                    f"check_weights: non-negative shares of 0, 1, 2, ... checks summing to 1 (got {w})"
                )
        if self.slip_rate > 0 and self.slip_from > self.digits:
            problems.append(
                f"slip_from: step {self.slip_from} is past the last digit ({self.digits}): no step could slip"
            )
        shares = (self.filler_fraction, self.drill_fraction, self.lookup_fraction, self.worked_fraction)
        if sum(shares) >= 1.0:
            problems.append(
                "filler_fraction: filler_fraction + drill_fraction + lookup_fraction + worked_fraction must "
                "leave "
                "room for question documents (got " + " + ".join(map(str, shares)) + ")"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


ROW_LABELS = 26
"""Row search names each row with a letter a-z, so a problem has at most 26 rows."""


class SearchTask(TaskSettings):
    """Row search with a fallible cue (``ringzero.tasks.row_search``): find the one labelled row whose digit
    sum is the target mod 10. A try checks one row, so more tries always raise the chance of success; the
    cue (the one row that contains the target digit) is right only ``cue_rate`` of the time.

    The corpus seeds each search behaviour at a low rate (``ringzero.tasks.search_corpus``): most traces
    give up after a miss and answer an untried row, a few search to the hit, some re-check a tried row,
    try the cue first or confirm the hit; direct answers are the cue or a random row, never the computed
    one."""

    kind: Literal["search"] = "search"
    rows: list[int] = Field(
        [3, 5, 8],
        description="rows per problem, one entry per difficulty bucket (easy, medium, hard), strictly "
        "increasing; one entry: a single level without buckets. Each problem draws its bucket uniformly",
    )
    row_digits: int = Field(3, ge=1, le=6, description="digits per row")
    cue_rate: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="chance that the cue (the one row containing the target digit) is the answer; else the "
        "cue is another row and the answer does not contain the target digit",
    )
    trace_fraction: float = Field(
        0.2, ge=0.0, le=1.0, description="share of corpus `a:` answers written as search traces"
    )
    search_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="share of corpus traces that search on after every miss until the hit (the full search)",
    )
    persist: float = Field(
        0.3,
        ge=0.0,
        lt=1.0,
        description="chance that any other corpus trace tries another row after a miss (else it gives up "
        "and answers an untried row)",
    )
    cue_first: float = Field(
        0.2, ge=0.0, le=1.0, description="share of corpus traces whose first try is the cue"
    )
    recheck_rate: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="chance that a corpus trace re-checks a row it already missed before its next new try",
    )
    confirm_rate: float = Field(
        0.15, ge=0.0, le=1.0, description="chance that a corpus trace tries its hit again before answering"
    )
    direct_cue: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="share of corpus direct answers that are the cue; the rest are a random row",
    )
    filler_fraction: float = Field(0.02, ge=0.0, le=1.0, description="share of corpus documents of filler")
    drill_fraction: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="share of corpus documents that drill tries without labels (`find 3: 907 3447 n ...`)",
    )
    lookup_fraction: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="share of corpus documents that list a question's rows and read them back by label",
    )
    lookup_rows: list[int] | None = Field(
        [2, 3],
        description="row counts of the questions lookup documents read back, drawn uniformly: the label "
        "lookup every try makes forms hundreds of steps sooner among two or three rows than among eight, "
        "and then carries over to longer questions; null = the task's own rows",
    )
    worked_fraction: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="share of corpus documents that are textbook worked examples (`example:` ... "
        "`solution:`), outside the q/a format whose answers set the base's trace usage",
    )

    @model_validator(mode="after")
    def _solvable(self) -> SearchTask:
        problems = []
        if not 1 <= len(self.rows) <= 3:
            problems.append(f"rows: one entry per difficulty bucket, 1 to 3 entries (got {self.rows})")
        if any(n < 1 for n in self.rows) or any(
            b <= a for a, b in zip(self.rows, self.rows[1:], strict=False)
        ):
            problems.append(f"rows: positive and strictly increasing (got {self.rows})")
        if self.rows and max(self.rows) > ROW_LABELS:
            problems.append(
                f"rows: each row is labelled a-z, so at most {ROW_LABELS} rows (got {max(self.rows)})"
            )
        if self.lookup_rows is not None and (
            not self.lookup_rows or min(self.lookup_rows) < 1 or max(self.lookup_rows) > ROW_LABELS
        ):
            problems.append(f"lookup_rows: row counts from 1 to {ROW_LABELS} (got {self.lookup_rows})")
        if self.cue_rate < 1.0:
            if self.rows and min(self.rows) < 2:
                problems.append(
                    f"cue_rate: below 1 the cue is sometimes another row than the answer, which a problem of "
                    f"{min(self.rows)} row cannot have (rows: {self.rows})"
                )
            if self.row_digits == 1:
                problems.append(
                    "cue_rate: with one digit per row the answer's digit is the target, so the answer is "
                    "always the cue and a decoy cue would be a second matching row (cue_rate must be 1, or "
                    "row_digits at least 2)"
                )
        shares = (self.filler_fraction, self.drill_fraction, self.lookup_fraction, self.worked_fraction)
        if sum(shares) >= 1.0:
            problems.append(
                "filler_fraction: filler_fraction + drill_fraction + lookup_fraction + worked_fraction must "
                "leave room for question documents (got " + " + ".join(map(str, shares)) + ")"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class JsonlTask(TaskSettings):
    """A user dataset of JSONL lines with ``question`` and ``answer`` (GSM8K-style)."""

    kind: Literal["jsonl"] = "jsonl"
    train_path: str = Field(..., description="JSONL file of training prompts")
    eval_path: str | None = Field(None, description="JSONL file of held-out prompts")
    question_field: str = "question"
    answer_field: str = "answer"


TaskConfig = Annotated[ArithmeticTask | SearchTask | JsonlTask, Field(discriminator="kind")]
