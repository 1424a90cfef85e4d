"""Row search: every problem solvable with one answer and one cue, the try checker, the search behaviours."""

import random
import re

import pytest
from pydantic import ValidationError

from ringzero.tasks import make_task
from ringzero.tasks.arithmetic import in_eval_split
from ringzero.tasks.base import ALPHABET
from ringzero.tasks.config import SearchTask
from ringzero.tasks.row_search import LABELS, digit_sum, parse_tries, remainders


@pytest.fixture(scope="module")
def task():
    return make_task(SearchTask())


def test_countdown_by_hand():
    assert remainders(3, "907") == "3447"  # 3 - 9 = -6 -> 4, 4 - 0 = 4, 4 - 7 = -3 -> 7
    assert remainders(3, "382") == "3020"  # the row sums to 13: nothing is left
    assert remainders(0, "55") == "050"
    assert remainders(7, "16") == "760"
    assert digit_sum("999") == 7


@pytest.mark.parametrize("rows,digits,cue_rate", [([3, 5, 8], 3, 0.5), ([2, 4], 2, 0.0), ([26], 1, 1.0)])
def test_every_problem_has_one_answer_and_one_cue(rows, digits, cue_rate):
    task = make_task(SearchTask(rows=rows, row_digits=digits, cue_rate=cue_rate))
    problems = task.prompts("train", 400, random.Random(3))
    cue_right = 0
    for p in problems:
        item = task.item(p)
        t = item.target
        assert len(item.rows) in rows and all(len(r) == digits for r in item.rows)
        assert [i for i, r in enumerate(item.rows) if digit_sum(r) == t] == [item.answer]
        assert [i for i, r in enumerate(item.rows) if str(t) in r] == [item.cue]
        assert p.answer == LABELS[item.answer]
        assert (
            p.prompt
            == f"q: find {t}: " + " ".join(f"{LABELS[i]}={r}" for i, r in enumerate(item.rows)) + "\na: "
        )
        assert set(p.prompt) <= set(ALPHABET)
        cue_right += item.cue == item.answer
    assert abs(cue_right / len(problems) - cue_rate) < 0.08


def test_buckets_follow_the_row_counts(task):
    problems = task.prompts("eval", 300)
    by_bucket = {}
    for p in problems:
        by_bucket.setdefault(task.difficulty_bucket(p), set()).add(len(p.meta["rows"]))
    assert by_bucket == {"easy": {3}, "medium": {5}, "hard": {8}}
    assert task.buckets() == ("easy", "medium", "hard")
    assert make_task(SearchTask(rows=[4])).buckets() == ()


def test_eval_split_is_fixed_and_disjoint(task):
    a, b = task.prompts("eval", 50), task.prompts("eval", 50)
    assert [p.id for p in a] == [p.id for p in b]
    assert all(in_eval_split(p.id) for p in a)
    assert not any(in_eval_split(p.id) for p in task.prompts("train", 200, 0))


def test_reward_reads_the_answer_after_the_trace(task):
    p = task.prompts("eval", 1)[0]
    item = task.item(p)
    wrong = LABELS[(item.answer + 1) % len(item.rows)]
    assert task.reward(p, p.answer) == 1.0
    assert task.reward(p, wrong) == 0.0
    assert task.reward(p, f"<think> </think> {p.answer}") == 1.0
    assert task.reward(p, f"<think> {p.answer}") == 0.0  # an unclosed trace has no answer
    assert task.reward(p, f"<think> </think> {p.answer}\nmore") == 1.0


def _problem(task, rows, target, answer, cue):
    from ringzero.tasks.base import PROMPT_TEMPLATE, Problem

    meta = {"target": target, "rows": rows, "answer": answer, "cue": cue}
    return Problem("x", PROMPT_TEMPLATE.format(question="q"), LABELS[answer], meta)


def test_verified_needs_every_try_right_and_the_hit_answered(task):
    # find 3: a=907 (sum 6) b=382 (sum 3, the answer) c=413 (sum 8, contains 3: the cue)
    p = _problem(task, ["907", "382", "413"], 3, 1, 2)
    assert remainders(3, "413") == "3985"
    assert task.verified("<think> c=413 3985 n a=907 3447 n b=382 3020 y </think> b", p)
    assert task.verified("<think> b=382 3020 y b=382 3020 y </think> b", p)  # a confirmed hit verifies
    assert not task.verified("<think> a=907 3447 n </think> b", p)  # right, but a guess after giving up
    assert not task.verified("<think> a=907 3446 n b=382 3020 y </think> b", p)  # a wrong remainder
    assert not task.verified("<think> a=907 4558 n b=382 3020 y </think> b", p)  # not from the target
    assert not task.verified("<think> a=906 3448 n b=382 3020 y </think> b", p)  # the row miscopied
    assert not task.verified("<think> a=907 3447 y b=382 3020 y </think> b", p)  # a wrong verdict
    assert not task.verified("<think> b=382 3020 y </think> a", p)  # the hit not answered
    assert not task.verified("<think> b=382 3020 y x </think> b", p)  # a fragment
    assert not task.verified("b", p)
    assert task.step_check("<think> a=907 3446 n b=382 3020 y zz </think> b", p) == (3, 1)
    # without the problem a try is judged on its own countdown and verdict, from whatever it started at
    assert task.step_check("<think> a=907 4558 n a=907 4558 y </think> c") == (2, 1)


def test_parse_tries_counts_fragments():
    tries, fragments = parse_tries("a=907 3447 n b=38 q c=413 3985 n")
    assert [(t.row, t.digits, t.sums, t.verdict) for t in tries] == [
        (0, "907", "3447", "n"),
        (2, "413", "3985", "n"),
    ]
    assert fragments == 2


def test_behaviour_metrics_by_hand(task):
    p = _problem(task, ["907", "382", "413", "555"], 3, 1, 2)
    responses = [
        "<think> c=413 3985 n a=907 3447 n b=382 3020 y b=382 3020 y </think> b",  # cue first, confirmed
        "<think> a=907 3447 n a=907 3447 n </think> d",  # a miss, a re-check, gives up, guesses untried d
        "<think> b=382 3020 y </think> b",  # first-try hit
        "c",  # direct
    ]
    m = task.behaviour_metrics(responses, [p] * 4)
    assert m["search/traces"] == 3
    assert m["search/tries"] == pytest.approx(7 / 3)
    assert m["search/first_try_hit"] == pytest.approx(1 / 3)
    assert m["search/likely_first"] == pytest.approx(1 / 3)
    assert m["search/give_up"] == pytest.approx(1 / 3)  # one trace gave up over three misses before a hit
    assert m["search/recheck"] == pytest.approx(1 / 7)
    assert m["search/confirm"] == pytest.approx(1 / 2)
    assert m["search/found"] == pytest.approx(2 / 3)
    assert m["search/guessed"] == pytest.approx(1 / 3)


def test_baseline_is_the_cue_and_scores_at_the_cue_rate():
    task = make_task(SearchTask(cue_rate=0.5))
    problems = task.prompts("eval", 600)
    hits = [task.reward(p, task.baseline_answer(p)) for p in problems]
    assert 0.43 < sum(hits) / len(hits) < 0.57


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"rows": [3, 3]}, "rows"),
        ({"rows": [5, 3]}, "rows"),
        ({"rows": [3, 5, 8, 9]}, "rows"),
        ({"rows": [3, 27]}, "rows"),
        ({"cue_rate": 1.5}, "cue_rate"),
        ({"cue_rate": -0.1}, "cue_rate"),
        ({"rows": [1, 3], "cue_rate": 0.5}, "cue_rate"),
        ({"row_digits": 1, "cue_rate": 0.5}, "cue_rate"),
        ({"lookup_fraction": 0.5, "worked_fraction": 0.5}, "filler_fraction"),
    ],
)
def test_unsolvable_configs_are_refused_naming_the_field(fields, named):
    with pytest.raises(ValidationError, match=named):
        SearchTask(**fields)


def test_one_digit_rows_are_solvable_when_the_cue_is_always_right():
    task = make_task(SearchTask(rows=[12], row_digits=1, cue_rate=1.0))
    for p in task.prompts("train", 50, 0):
        item = task.item(p)
        assert [i for i, r in enumerate(item.rows) if digit_sum(r) == item.target] == [item.answer]


def test_the_eval_baseline_is_the_cue_per_bucket_read_from_the_question_text():
    """``eval/baseline/<bucket>/accuracy`` against a reading of the prompt text alone: the cue is the one row
    holding the target digit, the answer the one whose digits sum to the target mod 10."""
    from ringzero.stages.eval_metrics import baseline_accuracy

    task = make_task(SearchTask(cue_rate=0.5))
    problems = task.prompts("eval", 90)
    got = baseline_accuracy(task, problems)
    want: dict[str, list[bool]] = {}
    for p in problems:
        target, rows = re.search(r"find (\d): (.*)$", p.prompt.splitlines()[0].split("q: ", 1)[-1]).groups()
        labelled = dict(pair.split("=") for pair in rows.split())
        cue = [label for label, digits in labelled.items() if target in digits]
        hit = [label for label, digits in labelled.items() if sum(map(int, digits)) % 10 == int(target)]
        assert len(cue) == 1 and len(hit) == 1
        bucket = {3: "easy", 5: "medium", 8: "hard"}[len(labelled)]
        want.setdefault(bucket, []).append(cue == hit)
    for bucket, hits in want.items():
        assert got[f"eval/baseline/{bucket}/accuracy"] == pytest.approx(sum(hits) / len(hits))
    assert got["eval/baseline/accuracy"] == pytest.approx(sum(map(sum, want.values())) / len(problems))
